"""A script whose Python dies without a word (as a crash in a native library would)."""

import os

os._exit(7)
