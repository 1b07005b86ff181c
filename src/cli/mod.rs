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

    /// The most bytes a trace file may hold, raw or decompressed (default 8GiB, or
    /// FRAGSIM_MAX_INPUT_SIZE).
    #[arg(long, global = true, value_name = "SIZE", value_parser = size_arg)]
    max_input_size: Option<u64>,
}

/// `--max-input-size`, set once by [`Cli::run`] before any command reads a trace.
static MAX_INPUT_SIZE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

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
        let _ = MAX_INPUT_SIZE.set(self.max_input_size);
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

/// How a command prints its results (`--format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// An aligned table for people.
    #[default]
    Table,
    /// One JSON object (interface.md).
    Json,
    /// CSV, one row per result, with the JSON keys as header.
    Csv,
}

/// The `--format table|json|csv` flag, with `--json` and `--csv` kept as its aliases.
#[derive(Debug, clap::Args)]
pub struct FormatArgs {
    /// How to print the results.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Table)]
    format: OutputFormat,

    /// Same as --format json.
    #[arg(long, conflicts_with_all = ["format", "csv"])]
    json: bool,

    /// Same as --format csv.
    #[arg(long, conflicts_with = "format")]
    csv: bool,
}

impl FormatArgs {
    /// The format asked for, by `--format` or an alias.
    pub fn format(&self) -> OutputFormat {
        match (self.json, self.csv) {
            (true, _) => OutputFormat::Json,
            (_, true) => OutputFormat::Csv,
            _ => self.format,
        }
    }
}

/// Parses a size flag such as `40GiB` for clap.
pub fn size_arg(text: &str) -> std::result::Result<u64, String> {
    fragsim::units::parse_size(text).map_err(|e| e.message().to_string())
}

/// Reads a trace for a command, with a progress bar when stderr is a terminal.
pub fn read_trace(path: &std::path::Path, keep_frames: bool) -> Result<fragsim::trace::Trace> {
    use std::io::IsTerminal;
    let options = fragsim::trace::ReadOptions {
        keep_frames,
        progress: std::io::stderr().is_terminal(),
        max_input_bytes: MAX_INPUT_SIZE.get().copied().flatten(),
    };
    fragsim::trace::read_trace(path, &options)
}

/// Names the trace's file and format on an input error raised after reading it (the engine or
/// a policy refusing the trace, with the event's place), so every message says where.
pub fn in_trace<'p>(
    path: &'p std::path::Path,
    trace: &fragsim::trace::Trace,
) -> impl Fn(fragsim::error::Error) -> fragsim::error::Error + 'p {
    let format = trace.format.name();
    move |e| match e.kind() {
        fragsim::error::ErrorKind::Input => e.in_format(format).in_file(path),
        _ if e.location().format.is_some() => e.in_file(path),
        _ => e,
    }
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
    fn format_aliases_choose_the_same_output_as_format() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["fragsim", "replay", "t.txt"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Replay(a) => a.output_format(),
                _ => unreachable!("parsed as replay"),
            })
        };
        assert_eq!(parse(&[]).unwrap(), OutputFormat::Table);
        assert_eq!(parse(&["--json"]).unwrap(), OutputFormat::Json);
        assert_eq!(parse(&["--format", "json"]).unwrap(), OutputFormat::Json);
        assert_eq!(parse(&["--csv"]).unwrap(), OutputFormat::Csv);
        assert_eq!(parse(&["--format", "csv"]).unwrap(), OutputFormat::Csv);
        assert!(parse(&["--json", "--csv"]).is_err());
        assert!(parse(&["--json", "--format", "table"]).is_err());
        assert!(parse(&["--format", "yaml"]).is_err());
    }

    #[test]
    fn sizes_accept_units() {
        assert_eq!(size_arg("40GiB"), Ok(40 << 30));
        assert!(size_arg("forty").is_err());
    }
}
