//! Integration tests: a raised cancel flag (what Ctrl-C raises in the Python package) stops
//! trace reading in every format, the `offline` planner, `synth` and `convert` with an error
//! that says what was interrupted and where, and a flag never raised changes nothing.

use fragsim::error::{Cancel, Place};
use fragsim::policy::offline::{self, Offline};
use fragsim::policy::Policy;
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::synth::{generate, SynthConfig};
use fragsim::trace::{self, Format, ReadOptions, Trace, FORMATS};
use std::path::Path;

/// A raised flag.
fn raised() -> Cancel {
    let cancel = Cancel::new();
    cancel.cancel();
    cancel
}

/// A small synthetic training trace (a few thousand events).
fn small_trace() -> Trace {
    let config = SynthConfig { layers: 2, hidden: 64, heads: 2, seq: 32, ..SynthConfig::default() };
    generate(&config).unwrap().0
}

fn reading(cancel: Cancel) -> ReadOptions {
    ReadOptions { keep_frames: true, cancel, ..ReadOptions::default() }
}

#[test]
fn a_raised_flag_stops_reading_every_format_naming_the_file_and_byte() {
    let trace = small_trace();
    let dir = tempfile::tempdir().unwrap();
    for row in &FORMATS {
        for gz in ["", ".gz"] {
            let path = dir.path().join(format!("t.{}{gz}", row.extensions[0]));
            trace::write_trace(&trace, &path).unwrap();
            // Never raised: the read is the one without a flag.
            let plain = trace::read_trace(&path, &reading(Cancel::default())).unwrap();
            let flagged = trace::read_trace(&path, &reading(Cancel::new())).unwrap();
            assert_eq!(flagged.devices[0].events, plain.devices[0].events, "{path:?}");
            let e = trace::read_trace(&path, &reading(raised())).unwrap_err();
            assert!(e.is_interrupted(), "{path:?}: {e}");
            assert_eq!(e.message(), "interrupted (Ctrl-C) while reading", "{path:?}");
            assert_eq!(e.location().file.as_deref(), Some(path.as_path()));
            assert_eq!(e.location().place, Some(Place::Byte(0)), "{path:?}");
            assert_eq!(e.to_string(), format!("{}: byte 0: {}", path.display(), e.message()));
            // From memory (the Python package's `bytes`), as from the file.
            let data = std::fs::read(&path).unwrap();
            let e = trace::read_memory(&data, &reading(raised())).unwrap_err();
            assert!(e.is_interrupted(), "{path:?} from memory: {e}");
            assert_eq!(e.location().place, Some(Place::Byte(0)), "{path:?} from memory");
        }
    }
}

#[test]
fn a_raised_flag_stops_converting_a_decoded_snapshot_at_its_first_entry() {
    // A snapshot pickle held whole (the path a stream that cannot be answered takes) is
    // converted entry by entry after decoding: the flag is looked at there too.
    let trace = small_trace();
    let mut data = Vec::new();
    trace::write_to(&trace, Format::PytorchSnapshot, &mut data).unwrap();
    let e = trace::snapshot::read(&data, &reading(raised())).unwrap_err();
    assert!(e.is_interrupted(), "{e}");
    assert!(matches!(e.location().place, Some(Place::Byte(b)) if b > 0), "{e}");
    assert!(trace::snapshot::read(&data, &reading(Cancel::new())).is_ok());
}

#[test]
fn a_raised_flag_stops_the_offline_planner() {
    let trace = small_trace();
    let events = &trace.devices[0].events;
    let n = events.len();
    let e = offline::plan(events, &[], 256, &raised()).unwrap_err();
    assert!(e.is_interrupted(), "{e}");
    assert_eq!(
        e.message(),
        format!("interrupted (Ctrl-C) while planning policy 'offline' at event 0 of {n}")
    );
    let (plan, _) = offline::plan(events, &[], 256, &Cancel::new()).unwrap();
    assert!(!plan.is_empty());
    // Built for a replay, the policy takes the replay's flag.
    let input = ReplayInput::new(&trace, None).unwrap();
    let options = ReplayOptions { cancel: raised(), ..ReplayOptions::default() };
    let mut policy = Offline::from_input("", &input.context(&options)).unwrap();
    let e = policy.prepare(events).unwrap_err();
    assert!(e.message().starts_with("interrupted (Ctrl-C) while planning policy 'offline'"));
}

#[test]
fn a_raised_flag_stops_synth_at_its_first_block() {
    let config = SynthConfig { cancel: raised(), ..SynthConfig::default() };
    let e = generate(&config).unwrap_err();
    assert!(e.is_interrupted(), "{e}");
    let event: u64 = e
        .message()
        .strip_prefix("interrupted (Ctrl-C) while generating the synthetic trace at event ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{e}"));
    // The parameters' allocations (4 blocks of 12 tensors, and 4 more) and the embeddings' few
    // events, then the first block looks at the flag.
    assert!(event < 80, "{e}");
}

/// Runs the command line `args` with a raised flag; returns its error.
fn run_cancelled(args: &[&str]) -> fragsim::Error {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut io = fragsim::cli::Io::buffers(&mut out, &mut err, false);
    io.cancel = raised();
    let argv = std::iter::once("fragsim").chain(args.iter().copied());
    match fragsim::cli::run(argv, &mut io) {
        Err(fragsim::cli::Failure::Command(e)) => e,
        other => panic!("{args:?}: {:?}", other.map_err(|_| "a usage error")),
    }
}

#[test]
fn a_raised_flag_stops_convert_and_synth_leaving_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("in.fst");
    trace::write_trace(&small_trace(), &source).unwrap();
    let out = dir.path().join("out.pickle");
    let (src, dst) = (source.to_str().unwrap(), out.to_str().unwrap());
    let e = run_cancelled(&["convert", src, dst]);
    assert!(e.is_interrupted(), "{e}");
    assert_eq!(e.location().file.as_deref(), Some(source.as_path()));
    assert!(!out.exists());
    let e = run_cancelled(&["synth", dst]);
    assert!(e.message().contains("while generating the synthetic trace"), "{e}");
    assert!(!out.exists());
    // Writing looks at the flag too: raised once the trace is read, the write stops and
    // leaves no half-written file.
    for name in ["w.pickle", "w.fst", "w.json.gz"] {
        let path = dir.path().join(name);
        let e = trace::write_trace_cancellable(&small_trace(), &path, &raised()).unwrap_err();
        assert!(e.is_interrupted(), "{name}: {e}");
        assert_eq!(e.message(), "interrupted (Ctrl-C) while writing");
        assert_eq!(e.location().file.as_deref(), Some(Path::new(&path)));
        assert_eq!(e.location().place, Some(Place::Byte(0)));
        assert!(!path.exists(), "{name}");
        trace::write_trace_cancellable(&small_trace(), &path, &Cancel::new()).unwrap();
        assert!(path.exists());
    }
}
