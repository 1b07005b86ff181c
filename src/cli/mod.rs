//! The `fragsim` command line: clap definitions, one file per command, turned into library calls.
//!
//! Nothing else in the library imports this module; it lives in the library (hidden from the
//! documented API) so that the binary, the Python package's `fragsim` command and its functions
//! all run the one implementation of each command through [`main`] or [`run`]. Each command
//! parses its flags into plain values (sizes, policy specs) before any slow work, so bad usage
//! fails at once, and writes through an [`Io`]: the process's stdout and stderr for the binary,
//! buffers for a Python function.

mod blame;
mod check;
mod convert;
mod diff;
mod explain;
mod fit;
mod info;
mod merge;
mod progress;
mod replay;
mod report;
mod sweep;
mod synth;
mod validate;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use fragsim::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

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

#[derive(Debug, Subcommand)]
enum Command {
    Info(info::Args),
    Convert(convert::Args),
    Replay(replay::Args),
    Validate(validate::Args),
    Report(report::Args),
    Synth(synth::Args),
    Fit(fit::Args),
    Sweep(sweep::Args),
    Merge(merge::Args),
    Check(check::Args),
    Blame(blame::Args),
    Diff(diff::Args),
    Explain(explain::Args),
}

impl Cli {
    /// The command line definition, with what only the library knows at run time: `replay
    /// --help` and `report --help` end with every registered policy and its options, from the
    /// one table (`fragsim::policy::POLICIES`), so the help cannot miss a policy.
    pub(crate) fn command_with_policies() -> clap::Command {
        let policies =
            format!("Policies (--policy NAME[:OPTIONS], or all):\n{}", fragsim::policy::help());
        Cli::command()
            .mut_subcommand("replay", |c| c.after_help(policies.clone()))
            .mut_subcommand("report", |c| c.after_help(policies.clone()))
            .mut_subcommand("blame", |c| c.after_help(policies.clone()))
            .mut_subcommand("explain", |c| c.after_help(policies))
    }

    /// Parses `argv` (the program name first) against [`Cli::command_with_policies`].
    pub(crate) fn try_parse_with_policies<I, T>(argv: I) -> std::result::Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Cli::from_arg_matches(&Cli::command_with_policies().try_get_matches_from(argv)?)
    }

    /// Whether the command prints its results on stdout (not a command that writes files, such
    /// as `report`, `convert`, `sweep --out` or `check --update`).
    fn prints_results(&self) -> bool {
        match &self.command {
            Command::Info(_) | Command::Replay(_) | Command::Validate(_) | Command::Fit(_) => true,
            Command::Merge(_) | Command::Blame(_) | Command::Diff(_) => true,
            Command::Explain(_) => true,
            Command::Sweep(a) => a.prints_results(),
            Command::Check(a) => a.prints_results(),
            Command::Convert(_) | Command::Report(_) | Command::Synth(_) => false,
        }
    }

    /// Runs the chosen command; `Ok` carries the exit code (0, or 1 for a failed check).
    pub(crate) fn run(self, io: &mut Io) -> Result<u8> {
        io.max_input_size = self.max_input_size;
        // A closed stdout (`>&-`) is no place for results: fail as a full disk does, before any
        // work, rather than print into nothing and exit 0.
        if io.stdio && self.prints_results() && stdout_closed() {
            return Err(Error::new(
                fragsim::error::ErrorKind::Io,
                "writing to stdout: stdout is closed (>&-); redirect it to a file or /dev/null",
            ));
        }
        match self.command {
            Command::Info(a) => info::run(a, io),
            Command::Convert(a) => convert::run(a, io),
            Command::Replay(a) => replay::run(a, io),
            Command::Validate(a) => validate::run(a, io),
            Command::Report(a) => report::run(a, io),
            Command::Synth(a) => synth::run(a, io),
            Command::Fit(a) => fit::run(a, io),
            Command::Sweep(a) => sweep::run(a, io),
            Command::Merge(a) => merge::run(a, io),
            Command::Check(a) => check::run(a, io),
            Command::Blame(a) => blame::run(a, io),
            Command::Diff(a) => diff::run(a, io),
            Command::Explain(a) => explain::run(a, io),
        }
    }
}

/// A trace handed to a command from memory instead of a file, under the name it is given on the
/// command line (the Python functions' `bytes`, file objects and snapshot dicts).
pub enum InMemory {
    /// A trace file's content (any format, gzip accepted), read as a file with that content is.
    Bytes(Vec<u8>),
    /// A trace its holder makes when the command reads it, with the command's read options:
    /// a snapshot dict is converted knowing whether the command keeps stack frames.
    Reader(TraceReader),
    /// A trace its holder keeps and may hand out again: every read of the name asks it, so a
    /// command that reads a trace twice (a sweep's built-in grid) and every later command on the
    /// same loaded trace (the Python package's `fragsim.load`) reuse one conversion.
    Shared(SharedReader),
}

/// Hands out an in-memory trace each time a command reads it ([`InMemory::Shared`]): the one its
/// holder keeps, shared, not copied.
pub type SharedReader = std::sync::Arc<
    dyn Fn(&fragsim::trace::ReadOptions) -> Result<std::sync::Arc<fragsim::trace::Trace>>
        + Send
        + Sync,
>;

/// Makes an in-memory trace with the reading command's options ([`InMemory::Reader`]).
pub type TraceReader =
    Box<dyn FnOnce(&fragsim::trace::ReadOptions) -> Result<fragsim::trace::Trace> + Send>;

/// Where a command writes and what it may read besides files: the process's stdout and stderr
/// for the binary ([`Io::stdio`]), buffers and in-memory traces for a Python function.
pub struct Io<'a> {
    /// What the command prints: its table, JSON or CSV.
    pub out: &'a mut dyn Write,
    /// Notes and error messages.
    pub err: &'a mut dyn Write,
    /// Whether progress bars may be drawn on the process's stderr (it is a terminal, and the
    /// caller wants them).
    pub progress: bool,
    /// Traces from memory, by the name that stands for them on the command line; each is taken
    /// by the first read of that name.
    pub memory: HashMap<PathBuf, InMemory>,
    /// Whether `out` and `err` are the process's own stdout and stderr (clap's usage errors
    /// are then printed by clap, in colour where the terminal takes it).
    stdio: bool,
    /// The global `--max-input-size`, set by [`Cli::run`] before any command reads a trace.
    max_input_size: Option<u64>,
    /// Whether the note that `--jobs` was lowered has been written (once per command).
    pub(crate) jobs_noted: bool,
    /// Whether the note that a snapshot holds no memory history has been written (once per
    /// command).
    history_noted: bool,
    /// Stops the command's replays early when raised: the Python package raises it when Ctrl-C
    /// interrupts the call, so abandoned work does not go on in the background. The binary's is
    /// raised only by Ctrl-C on the cuda backend ([`fragsim::replay::Cancel`]); elsewhere Ctrl-C
    /// ends the process.
    pub cancel: fragsim::replay::Cancel,
}

impl<'a> Io<'a> {
    /// The process's stdout and stderr; progress bars where stderr is a terminal.
    pub fn stdio(out: &'a mut dyn Write, err: &'a mut dyn Write) -> Io<'a> {
        use std::io::IsTerminal;
        let progress = std::io::stderr().is_terminal();
        Io {
            out,
            err,
            progress,
            memory: HashMap::new(),
            stdio: true,
            max_input_size: None,
            jobs_noted: false,
            history_noted: false,
            cancel: fragsim::replay::Cancel::default(),
        }
    }

    /// Writers of the caller's choosing (buffers), with no progress bars unless `progress`.
    pub fn buffers(out: &'a mut dyn Write, err: &'a mut dyn Write, progress: bool) -> Io<'a> {
        Io {
            out,
            err,
            progress,
            memory: HashMap::new(),
            stdio: false,
            max_input_size: None,
            jobs_noted: false,
            history_noted: false,
            cancel: fragsim::replay::Cancel::default(),
        }
    }

    /// A note for the user on `err` (`fragsim: {text}`); a note that cannot be written is lost,
    /// as an `eprintln!` to a closed stderr would be.
    pub(crate) fn note(&mut self, text: &str) {
        // A path or a name in a note is shown as text, line by line: it cannot forge a line or
        // send the terminal an escape.
        let lines: Vec<_> = text.split('\n').map(fragsim::error::printable).collect();
        let _ = writeln!(self.err, "fragsim: {}", lines.join("\n"));
    }

    /// The global `--max-input-size`, if given (else the library's default and its environment
    /// variable apply).
    pub(crate) fn max_input_bytes(&self) -> Option<u64> {
        self.max_input_size
    }

    /// Reads the trace `path` names: the in-memory trace of that name (shared where its holder
    /// keeps it), else the file, with the reader's progress bar when `progress`.
    pub(crate) fn read_trace(
        &mut self,
        path: &Path,
        keep_frames: bool,
        progress: bool,
    ) -> Result<std::sync::Arc<fragsim::trace::Trace>> {
        let options = fragsim::trace::ReadOptions {
            keep_frames,
            progress: progress && self.progress,
            max_input_bytes: self.max_input_size,
            cancel: self.cancel.clone(),
        };
        let trace = self.read_held_or_file(path, &options)?;
        self.note_no_history(trace.no_history_note(path));
        Ok(trace)
    }

    /// Says once that a snapshot holds no memory history, where `note` says so.
    pub(crate) fn note_no_history(&mut self, note: Option<String>) {
        if let Some(note) = note.filter(|_| !self.history_noted) {
            self.history_noted = true;
            self.note(&note);
        }
    }

    /// Reads `path` from the in-memory trace of that name (taken, unless its holder keeps it),
    /// else from the file.
    fn read_held_or_file(
        &mut self,
        path: &Path,
        options: &fragsim::trace::ReadOptions,
    ) -> Result<std::sync::Arc<fragsim::trace::Trace>> {
        use std::sync::Arc;
        if let Some(InMemory::Shared(read)) = self.memory.get(path) {
            return read(options).map_err(|e| e.in_file(path));
        }
        match self.memory.remove(path) {
            Some(InMemory::Reader(read)) => {
                read(options).map(Arc::new).map_err(|e| e.in_file(path))
            }
            Some(InMemory::Bytes(data)) => fragsim::trace::read_memory(&data, options)
                .map(Arc::new)
                .map_err(|e| e.in_file(path)),
            Some(InMemory::Shared(_)) | None => {
                fragsim::trace::read_trace(path, options).map(Arc::new)
            }
        }
    }

    /// Whether `path` names an in-memory trace not read yet (or one its holder keeps).
    pub(crate) fn holds(&self, path: &Path) -> bool {
        self.memory.contains_key(path)
    }
}

/// The version `fragsim --version` prints.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The names of the commands, as typed on the command line.
pub fn commands() -> Vec<String> {
    Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect()
}

/// Why [`run`] ended without an exit code of its own: the command line did not parse (or asked
/// for `--help`/`--version`, which clap answers as an "error"), or the command failed.
#[derive(Debug)]
pub enum Failure {
    /// From clap: bad usage, or the text of `--help` / `--version`.
    Clap(clap::Error),
    /// The command's error, whose kind decides the exit code.
    Command(Error),
}

/// Parses `argv` (the program name first) and runs the command on `io`: `Ok` carries the exit
/// code (0, or 1 for a failed check). The one entry point of every command, for the binary, the
/// Python package's `fragsim` command ([`main`]) and the Python functions.
pub fn run<I, T>(argv: I, io: &mut Io) -> std::result::Result<u8, Failure>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_with_policies(argv).map_err(Failure::Clap)?;
    cli.run(io).map_err(Failure::Command)
}

/// [`run`], with every outcome printed as the binary prints it and turned into the process's
/// exit code: usage errors and `--help` by clap, a failed command as `fragsim: {error}` on
/// `io.err` (a reader that closed the pipe early ends quietly with 0, as ripgrep does; Ctrl-C
/// on the cuda backend exits 130 once the device memory is released).
pub fn main<I, T>(argv: I, io: &mut Io) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match run(argv, io) {
        Ok(code) => code,
        Err(Failure::Clap(e)) => {
            if io.stdio {
                let _ = e.print();
            } else if e.use_stderr() {
                let _ = write!(io.err, "{}", e.render());
            } else {
                let _ = write!(io.out, "{}", e.render());
            }
            if e.use_stderr() {
                2
            } else {
                0
            }
        }
        Err(Failure::Command(err)) => {
            if err.is_broken_pipe() {
                return 0;
            }
            let _ = writeln!(io.err, "fragsim: {err}");
            if fragsim::replay::Cancel::interrupted() {
                return INTERRUPTED_EXIT_CODE;
            }
            err.kind().exit_code()
        }
    }
}

/// The exit code after Ctrl-C stopped a command (128 + SIGINT, as shells report it).
const INTERRUPTED_EXIT_CODE: u8 = 130;

/// Whether the process started with its stdout closed. The Rust runtime opens `/dev/null`
/// read-write in place of a closed standard descriptor, so a closed stdout shows as `/dev/null`
/// open for reading and writing, which a shell's `>/dev/null` never gives (it opens write-only).
/// Linux only (it reads `/proc`); elsewhere always false.
fn stdout_closed() -> bool {
    let Ok(target) = std::fs::read_link("/proc/self/fd/1") else { return false };
    if target != Path::new("/dev/null") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/fdinfo/1") else { return false };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 == 0o2)
}

/// Reads a JSON file fragsim wrote (a sweep part, a baseline) under the global
/// `--max-input-size` ([`fragsim::whatif::own_json::read`]).
pub(crate) fn read_capped(io: &Io, path: &Path, what: &str) -> Result<Vec<u8>> {
    fragsim::whatif::own_json::read(path, what, io.max_input_bytes())
}

/// `--pytorch-version`, on every command that replays policies: the PyTorch release each
/// `pytorch` policy models, as a what-if (docs/interface.md, "PyTorch versions").
#[derive(Debug, Clone, clap::Args)]
pub struct VersionFlag {
    /// What-if: every pytorch policy models PyTorch release V (2.0 … 2.15), as `version=V` in
    /// its spec does (default: the release the recording shows, else 2.11).
    #[arg(long, value_name = "V", value_parser = version_text)]
    pytorch_version: Option<String>,
}

impl VersionFlag {
    /// `written` (`default` where empty) with the version asked added to each PyTorch spec;
    /// `written` as it is where the flag is not given.
    pub(crate) fn apply(&self, written: &[String], default: &[&str]) -> Result<Vec<String>> {
        match &self.pytorch_version {
            None => Ok(written.to_vec()),
            Some(v) => fragsim::policy::PolicySpec::at_version(written, default, v),
        }
    }

    /// Whether the flag was given.
    pub(crate) fn given(&self) -> bool {
        self.pytorch_version.is_some()
    }
}

/// Checks `--pytorch-version`'s value for clap.
fn version_text(text: &str) -> std::result::Result<String, String> {
    fragsim::policy::pytorch::config::Version::parse(text)
        .map(|v| v.to_string())
        .map_err(|e| e.message().to_string())
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

    #[command(flatten)]
    pub capacity: CapacityFlag,

    /// What-if: every policy calls empty_cache() (releases its wholly free cached segments)
    /// after every N-th event.
    #[arg(long, value_name = "N")]
    pub empty_cache_every: Option<u64>,

    /// What-if: every policy calls empty_cache() after each of these event indices.
    #[arg(long, value_name = "I,J,...", value_delimiter = ',')]
    pub empty_cache_at: Vec<u64>,

    /// What-if: drop the empty_cache() calls the recording holds.
    #[arg(long)]
    pub no_recorded_empty_cache: bool,

    #[command(flatten)]
    pub version: VersionFlag,
}

impl ReplaySource {
    /// The `-p` values with `--pytorch-version` applied (`default`: the command's policies
    /// where no `-p` is given).
    pub(crate) fn policies(&self, default: &[&str]) -> Result<Vec<String>> {
        self.version.apply(&self.policies, default)
    }

    /// The `empty_cache` what-if the flags describe.
    pub(crate) fn empty_cache_plan(&self) -> Result<fragsim::replay::EmptyCachePlan> {
        fragsim::replay::EmptyCachePlan::new(
            self.empty_cache_every,
            self.empty_cache_at.clone(),
            self.no_recorded_empty_cache,
        )
    }
}

/// The `--capacity` flag of every command that replays: with several traces (`sweep`, `check`),
/// each trace's capacity is resolved on its own ([`fragsim::session::Session::capacity`]).
#[derive(Debug, clap::Args)]
pub struct CapacityFlag {
    /// Device memory, e.g. 40GiB or 80GB (at least 1 MiB), or a card by name (a100-40gb,
    /// h100-80gb, rtx-4090, ...: the total its driver reports): allocations beyond it fail as
    /// OOM. Default (`recorded`): the limit each recording implies, where it shows the device
    /// running out; `none`: unlimited.
    #[arg(
        long,
        value_name = "SIZE|CARD|recorded|none",
        value_parser = capacity_arg,
        allow_hyphen_values = true
    )]
    capacity: Option<CapacityArg>,
}

impl CapacityFlag {
    /// The flag as given (`None`: not given, which reads as `recorded`).
    pub(crate) fn get(&self) -> Option<&CapacityArg> {
        self.capacity.as_ref()
    }
}

/// What `--capacity` says: the library's [`fragsim::session::Capacity`].
pub use fragsim::session::Capacity as CapacityArg;

/// Parses `--capacity` for clap ([`fragsim::session::Capacity::parse`]).
pub(crate) fn capacity_arg(text: &str) -> std::result::Result<CapacityArg, String> {
    CapacityArg::parse(text)
}

/// The table's first line for the capacity a replay ran under: as typed and in GiB (with the
/// card a name stands for), or the inferred limit; `None` when unlimited.
pub(crate) fn capacity_header(arg: Option<&CapacityArg>, bytes: Option<u64>) -> Option<String> {
    let bytes = bytes?;
    Some(match arg {
        Some(CapacityArg::Size { typed, bytes }) => {
            let described = fragsim::units::describe_capacity(typed, *bytes);
            match fragsim::units::cards::named(typed) {
                Some(card) => format!(
                    "capacity: {typed} ({:.2} GiB, the total the {}'s driver reports)",
                    *bytes as f64 / fragsim::units::GIB as f64,
                    card.model
                ),
                None => match near_card(typed, *bytes) {
                    Some(note) => format!("capacity: {described}; {note}"),
                    None => format!("capacity: {described}"),
                },
            }
        }
        _ => format!("capacity: {}", inferred_capacity(bytes)),
    })
}

/// A capacity inferred from the recording, for headers: `200.00 MiB (209715200 B, inferred
/// from the recording)`.
pub(crate) fn inferred_capacity(bytes: u64) -> String {
    format!("{} ({bytes} B, inferred from the recording)", fragsim::units::format_bytes(bytes))
}

/// For a capacity typed in decimal units (`40GB`) within a few percent of a card's nominal size
/// (sold as "40 GB"), a note saying what the cards of that size really report and how to name
/// them; `None` near no card.
pub(crate) fn near_card(typed: &str, bytes: u64) -> Option<String> {
    let t = typed.trim().to_ascii_lowercase();
    if !(t.ends_with("gb") || t.ends_with("tb")) {
        return None;
    }
    // "40GB" typed for a card sold as 40 GB: the gap between N GB and N GiB is 6.9%.
    let nominal = (bytes as f64 / 1e9).round() as u32;
    if (f64::from(nominal) * 1e9 - bytes as f64).abs() > 0.005 * bytes as f64 {
        return None;
    }
    let cards: Vec<String> = fragsim::units::cards::of_nominal(nominal)
        .map(|c| format!("{} {} GiB (--capacity {})", c.model, c.reported_gib, c.name))
        .collect();
    (!cards.is_empty())
        .then(|| format!("cards sold as {nominal} GB report other sizes: {}", cards.join(", ")))
}

/// How a command prints its results (`--format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// An aligned table for people.
    #[default]
    Table,
    /// One JSON object (docs/interface.md).
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
    pub(crate) fn format(&self) -> OutputFormat {
        match (self.json, self.csv) {
            (true, _) => OutputFormat::Json,
            (_, true) => OutputFormat::Csv,
            _ => self.format,
        }
    }
}

/// Prints a command's result on `out` in `format`: the JSON object of `value` (pretty, with a
/// final newline), or the CSV or table text the command makes of it. One place, so every command
/// that prints a result prints JSON and reports a closed stdout the same way.
pub(crate) fn print_as<T: serde::Serialize>(
    out: &mut dyn Write,
    format: OutputFormat,
    value: &T,
    csv: impl FnOnce(&T) -> String,
    table: impl FnOnce(&T) -> String,
) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    match format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, value)
                .map_err(|e| Error::writing("to stdout", e.into()))?;
            writeln!(out).map_err(io)
        }
        OutputFormat::Csv => write!(out, "{}", csv(value)).map_err(io),
        OutputFormat::Table => write!(out, "{}", table(value)).map_err(io),
    }
}

/// Parses a size flag such as `40GiB` for clap.
pub(crate) fn size_arg(text: &str) -> std::result::Result<u64, String> {
    fragsim::units::parse_size(text).map_err(|e| e.message().to_string())
}

/// Reads a trace for a command, with a progress bar when stderr is a terminal.
pub(crate) fn read_trace(
    io: &mut Io,
    path: &Path,
    keep_frames: bool,
) -> Result<std::sync::Arc<fragsim::trace::Trace>> {
    io.read_trace(path, keep_frames, true)
}

/// Says, unless `--quiet`, what the session's recording changes about a replay of `specs`
/// ([`fragsim::session::Session::notes`]): torch_npu's rules, a warm start, the PyTorch version
/// modelled, ROCm's expandable segments, and recorded options this fragsim leaves out (a newer PyTorch's: the replay goes on
/// without them rather than refusing a recording PyTorch made).
pub(crate) fn print_notes(
    control: &progress::Control,
    io: &mut Io,
    session: &fragsim::session::Session,
    specs: &[fragsim::policy::PolicySpec],
) {
    for note in session.notes(specs) {
        control.note(io, &note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command_with_policies().debug_assert();
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

    #[test]
    fn a_capacity_needs_a_unit_and_keeps_what_was_typed() {
        let c = capacity_arg("40GB").unwrap();
        assert_eq!(c, CapacityArg::Size { typed: "40GB".into(), bytes: 40_000_000_000 });
        // 40 GB (37.25 GiB) is not what an A100 40GB reports (39.59 GiB): the header says so.
        assert_eq!(
            capacity_header(Some(&c), Some(40_000_000_000)).as_deref(),
            Some(
                "capacity: 40GB (37.25 GiB); cards sold as 40 GB report other sizes: A100 40GB \
                 39.59 GiB (--capacity a100-40gb)"
            )
        );
        let card = capacity_arg("a100_40GB").unwrap();
        assert_eq!(card, CapacityArg::Size { typed: "a100-40gb".into(), bytes: 40_540 << 20 });
        assert_eq!(
            capacity_header(Some(&card), Some(40_540 << 20)).as_deref(),
            Some("capacity: a100-40gb (39.59 GiB, the total the A100 40GB's driver reports)")
        );
        let e = capacity_arg("a100-40g").unwrap_err();
        assert!(e.contains("unknown card 'a100-40g': did you mean 'a100-40gb'?"), "{e}");
        assert!(e.contains("h100-80gb") && e.contains("40GiB"), "lists the names and sizes: {e}");
        let exact = capacity_arg("40GiB").unwrap();
        assert_eq!(
            capacity_header(Some(&exact), Some(40 << 30)).as_deref(),
            Some("capacity: 40GiB (40.00 GiB)")
        );
        assert_eq!(near_card("60GB", 60_000_000_000), None, "near no card");
        assert_eq!(capacity_arg("recorded"), Ok(CapacityArg::Recorded));
        assert_eq!(capacity_arg("none"), Ok(CapacityArg::Unlimited));
        assert_eq!(capacity_header(Some(&CapacityArg::Unlimited), None), None);
        let e = capacity_arg("40").unwrap_err();
        assert!(e.contains("40GB") && e.contains("40GiB"), "{e}");
        let parsed = Cli::try_parse_from(["fragsim", "replay", "t.txt", "--capacity", "40"]);
        assert!(parsed.is_err());
    }

    #[test]
    fn capacity_messages_name_the_fix() {
        let e = capacity_arg("40G").unwrap_err();
        assert!(e.contains("ambiguous") && e.contains("40GB (40000000000 B)"), "{e}");
        assert!(e.contains("40GiB (42949672960 B)"), "{e}");
        assert!(capacity_arg("2m").unwrap_err().contains("2MB"), "one-letter units in any case");
        let e = capacity_arg("-5GB").unwrap_err();
        assert!(e.contains("negative") && e.contains("e.g. 5GB") && e.contains("'none'"), "{e}");
        let e = capacity_arg("0").unwrap_err();
        assert!(e.contains("holds no allocation") && e.contains("'none'"), "{e}");
        assert!(capacity_arg("0GiB").unwrap_err().contains("holds no allocation"));
    }
}
