//! The command line as a process of its own, for tests that set its environment (the Hub's
//! `HF_*` variables): the same [`vramplan::run`] the `vramplan` binary calls.

use std::io::Write;

fn main() {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = vramplan::run(std::env::args_os(), &mut stdout.lock(), &mut stderr.lock());
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}
