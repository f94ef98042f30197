"""A script that never ends: `validate --script --time-limit` must stop it."""

import time

while True:
    time.sleep(0.1)
