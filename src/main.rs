//! The `fragsim` binary: the command line of [`fragsim::cli`] on the process's stdout and
//! stderr, its outcome as the exit code.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Unlocked handles: progress bars draw on stderr from other threads while a command runs.
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut io = fragsim::cli::Io::stdio(&mut out, &mut err);
    ExitCode::from(fragsim::cli::main(std::env::args_os(), &mut io))
}
