//! The `fragsim` binary: parse, run, print an error once, exit with its code.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse_with_policies() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match cli.run() {
        Ok(code) => code,
        Err(err) => {
            // `fragsim ... | head`: the reader has what it wanted; end quietly, as ripgrep does.
            if err.is_broken_pipe() {
                return ExitCode::SUCCESS;
            }
            eprintln!("fragsim: {err}");
            if fragsim::backend::cuda::interrupt::requested() {
                // Ctrl-C on the cuda backend: the device memory was released on the way out.
                return ExitCode::from(fragsim::backend::cuda::interrupt::EXIT_CODE);
            }
            ExitCode::from(err.kind().exit_code())
        }
    }
}
