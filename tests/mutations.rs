//! Integration tests: seeded random corruptions of valid traces, in every format.
//!
//! `bad_input.rs` pins the message for each corruption someone thought of; this module looks
//! for the ones nobody did. Each mutated file is read from disk as the CLI reads a path (gzip
//! and format by content), and when it still parses, replayed through `pytorch` and `offline`.
//! Every outcome must be a trace or an error, and every error must name the file: a panic fails
//! the test. The mutations are the usual ones of a byte fuzzer (flipped bytes, truncation,
//! inserted, duplicated and deleted spans, bytes set to boundary values) from a fixed seed, so a
//! failure reproduces; the failing case's seed, format and mutation are in the message.

use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::testing::Rng;
use fragsim::trace::{read_trace, write_to, DeviceTrace, Format, ReadOptions, Trace};
use std::io::Write;

/// Mutated files per format.
const PER_FORMAT: u64 = 400;

/// One byte-fuzzer mutation of `data`, and what it did (for the failure message).
fn mutate(data: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let mut d = data.to_vec();
    let at = rng.index(d.len());
    let span = (at + 1 + rng.index(256)).min(d.len());
    let what = match rng.index(6) {
        0 => {
            for _ in 0..1 + rng.index(8) {
                let i = rng.index(d.len());
                d[i] = rng.index(256) as u8;
            }
            "flipped bytes".to_string()
        }
        1 => {
            d.truncate(at);
            format!("truncated at {at}")
        }
        2 => {
            let junk: Vec<u8> = (0..1 + rng.index(16)).map(|_| rng.index(256) as u8).collect();
            d.splice(at..at, junk);
            format!("inserted bytes at {at}")
        }
        3 => {
            let copy = d[at..span].to_vec();
            d.splice(at..at, copy);
            format!("duplicated {at}..{span}")
        }
        4 => {
            d.drain(at..span);
            format!("deleted {at}..{span}")
        }
        _ => {
            for _ in 0..1 + rng.index(4) {
                let i = rng.index(d.len());
                d[i] = [0, 0x7f, 0x80, 0xff, b'-', b'9', b'e'][rng.index(7)];
            }
            "boundary bytes".to_string()
        }
    };
    (d, what)
}

/// The first 1,000 events of the bundled trace, written in `format` (gzip-compressed text when
/// `gzip`).
fn seed_file(format: Format, gzip: bool) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/gpt-4l-512h.txt");
    let trace = read_trace(&path, &ReadOptions::default()).expect("the bundled trace reads");
    let device = &trace.devices[0];
    let events = device.events[..1000.min(device.events.len())].to_vec();
    let small = Trace { devices: vec![DeviceTrace { device: device.device, events }], ..trace };
    let mut out = Vec::new();
    write_to(&small, format, &mut out).expect("writes");
    if gzip {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&out).expect("compresses");
        out = enc.finish().expect("compresses");
    }
    out
}

#[test]
fn mutated_traces_are_read_or_refused_never_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    let seeds = [
        ("txt", seed_file(Format::Text, false)),
        ("txt.gz", seed_file(Format::Text, true)),
        ("pickle", seed_file(Format::PytorchSnapshot, false)),
        ("json", seed_file(Format::Kineto, false)),
        ("csv", seed_file(Format::RmmCsv, false)),
        ("fst", seed_file(Format::Fst, false)),
    ];
    let options = ReplayOptions::default();
    let (mut read, mut refused) = (0, 0);
    for (k, (ext, seed)) in seeds.iter().enumerate() {
        let mut rng = Rng::new(0x5eed_0000 + k as u64 * 7919);
        for n in 0..PER_FORMAT {
            let (bytes, what) = mutate(seed, &mut rng);
            let path = dir.path().join(format!("mutated.{ext}"));
            std::fs::write(&path, &bytes).expect("writes the mutated file");
            let case = format!("{ext} case {n} ({what})");
            let trace = match read_trace(&path, &ReadOptions::default()) {
                Ok(trace) => trace,
                Err(e) => {
                    let message = e.to_string();
                    assert!(message.contains("mutated."), "{case}: error names no file: {message}");
                    refused += 1;
                    continue;
                }
            };
            read += 1;
            let Ok(input) = ReplayInput::new(&trace, None) else { continue };
            for name in ["pytorch", "offline"] {
                let spec = PolicySpec { name: name.to_string(), options: String::new() };
                let info = policy::lookup(name).expect("built-in");
                // A replay may refuse what it cannot make sense of; it must not panic.
                let _ = info.run(&spec, &input, &options);
            }
        }
    }
    // Both outcomes happen, so the mutations reach past the first bytes of each format.
    assert!(read > 0 && refused > 0, "read {read}, refused {refused}");
}
