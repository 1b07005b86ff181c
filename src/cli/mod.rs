//! The `fragsim` command line: clap definitions, one file per command, turned into library calls.
//!
//! Nothing in the library imports this module. Each command parses its flags into plain values
//! (sizes, policy specs) before any slow work, so bad usage fails at once.

mod convert;
mod info;
mod replay;
mod report;
mod synth;
mod validate;

use clap::{Parser, Subcommand};
use fragsim::error::Result;
use std::process::ExitCode;

/// Replay GPU allocation traces against allocator policies; report peak reserved memory and
/// fragmentation.
#[derive(Debug, Parser)]
#[command(name = "fragsim", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Info(info::Args),
    Convert(convert::Args),
    Replay(replay::Args),
    Validate(validate::Args),
    Report(report::Args),
    Synth(synth::Args),
}

impl Cli {
    /// Runs the chosen command; `Ok` carries the exit code (1 for a failed check).
    pub fn run(self) -> Result<ExitCode> {
        match self.command {
            Command::Info(a) => info::run(a),
            Command::Convert(a) => convert::run(a),
            Command::Replay(a) => replay::run(a),
            Command::Validate(a) => validate::run(a),
            Command::Report(a) => report::run(a),
            Command::Synth(a) => synth::run(a),
        }
    }
}

/// The flags `replay` and `report` share: what to replay, against what, on which device.
#[derive(Debug, clap::Args)]
pub struct ReplaySource {
    /// The trace: PyTorch snapshot, Kineto JSON, RMM CSV, .fst or text (gzip accepted).
    #[arg(value_name = "TRACE")]
    pub trace: std::path::PathBuf,

    /// A policy as NAME or NAME:OPTIONS (repeatable; `all` for every built-in policy).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    pub policies: Vec<String>,

    /// The device to replay (default: the device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub device: Option<i32>,

    /// Device memory, e.g. 40GiB or 80GB: allocations beyond it fail as OOM.
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub capacity: Option<u64>,
}

/// Parses a size flag such as `40GiB` for clap.
pub fn size_arg(text: &str) -> std::result::Result<u64, String> {
    fragsim::units::parse_size(text).map_err(|e| e.message().to_string())
}

/// Reads a trace for a command, with a progress bar when stderr is a terminal.
pub fn read_trace(path: &std::path::Path, keep_frames: bool) -> Result<fragsim::trace::Trace> {
    use std::io::IsTerminal;
    let options =
        fragsim::trace::ReadOptions { keep_frames, progress: std::io::stderr().is_terminal() };
    fragsim::trace::read_trace(path, &options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_accept_units() {
        assert_eq!(size_arg("40GiB"), Ok(40 << 30));
        assert!(size_arg("forty").is_err());
    }
}
