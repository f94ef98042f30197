//! The `vramplan` binary: hands the command line to [`vramplan::run`] and exits with its code.

use std::io::Write;

fn main() {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = vramplan::run(std::env::args_os(), &mut stdout.lock(), &mut stderr.lock());
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}
