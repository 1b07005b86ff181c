//! Reading speed (MB/s of decompressed input) per trace format, on the real traces shipped in
//! `traces/real/`.
//!
//! The headline is the largest PyTorch snapshot with and without frames (the Python baseline is
//! `pickle.load` at ≈ 18 MB/s with its garbage collector on, ≈ 69 MB/s without), and a large
//! one made from it (`snapshot-repeated`: its trace entries 15 times, 54 MB, built in memory by
//! `support/repeat.rs` as Python's pickler would write a longer run); the whole-process
//! comparison with `pickle.load` is in docs/performance.md#reading-snapshots.
//! Every other real trace is read through `trace::read_bytes` after content detection; a format
//! whose reader is still a stub is skipped with a note. `.fst` is read from the largest snapshot
//! converted in memory.

#[path = "support/repeat.rs"]
mod repeat;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fragsim::trace::{self, detect, Format, ReadOptions};
use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn real(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real").join(name)
}

/// The file's bytes, gunzipped when compressed (the readers see decompressed data).
/// Panics when it cannot: the real traces ship with the repository.
fn load(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out
    } else {
        raw
    }
}

fn options(keep_frames: bool) -> ReadOptions {
    ReadOptions { keep_frames, ..ReadOptions::default() }
}

fn largest_snapshot(c: &mut Criterion) {
    let data = load(&real("cs336-medium-ctx512-train.pickle"));
    let mut g = c.benchmark_group("snapshot");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.measurement_time(Duration::from_secs(5));
    for (label, keep_frames) in [("no-frames", false), ("frames", true)] {
        g.bench_function(format!("cs336-medium-ctx512-train/{label}"), |b| {
            b.iter(|| {
                trace::read_bytes(black_box(&data), Format::PytorchSnapshot, &options(keep_frames))
                    .expect("the real snapshot reads")
            })
        });
    }
    g.bench_function("cs336-medium-ctx512-train/pickle-decode-only", |b| {
        b.iter(|| fragsim::trace::pickle::decode(black_box(&data)).expect("decodes").root())
    });
    g.finish();
}

/// The largest real snapshot's trace entries repeated 15 times (54 MB), read as a file is
/// (streamed, one batch of entries at a time), with frames and without.
fn repeated_snapshot(c: &mut Criterion) {
    let real = load(&real("cs336-medium-ctx512-train.pickle"));
    let data = repeat::repeat(&real, 15).expect("the real snapshot repeats");
    let mut g = c.benchmark_group("snapshot-repeated");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    for (label, keep_frames) in [("no-frames", false), ("frames", true)] {
        g.bench_function(format!("cs336-medium-ctx512-train-x15/{label}"), |b| {
            b.iter(|| {
                trace::read_bytes(black_box(&data), Format::PytorchSnapshot, &options(keep_frames))
                    .expect("the repeated snapshot reads")
            })
        });
    }
    g.finish();
}

/// `.fst`, the format `synth` and `convert` write and `replay` streams: the largest snapshot as
/// `fragsim convert` writes it (no frames), read back. Throughput in events, the unit of the
/// replay benches.
fn fst(c: &mut Criterion) {
    let snapshot = load(&real("cs336-medium-ctx512-train.pickle"));
    let trace = trace::read_bytes(&snapshot, Format::PytorchSnapshot, &options(false))
        .expect("the real snapshot reads");
    let mut data = Vec::new();
    trace::fst::write(&trace, &mut data).expect("writes to memory");
    let events: usize = trace.devices.iter().map(|d| d.events.len()).sum();
    let mut g = c.benchmark_group("fst");
    g.throughput(Throughput::Elements(events as u64));
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("cs336-medium-ctx512-train", |b| {
        b.iter(|| trace::read_bytes(black_box(&data), Format::Fst, &options(false)).expect("reads"))
    });
    g.finish();
}

fn every_real_trace(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    paths.retain(|p| {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        (n.ends_with(".pickle") || n.ends_with(".json.gz"))
            && n != "cs336-medium-ctx512-train.pickle"
    });
    paths.sort();
    let mut g = c.benchmark_group("read");
    g.measurement_time(Duration::from_secs(3));
    for path in paths {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        let data = load(&path);
        let Some(format) = detect::detect(&data) else {
            eprintln!("skipping {name}: format not recognised");
            continue;
        };
        if let Err(e) = trace::read_bytes(&data, format, &options(false)) {
            eprintln!("skipping {name} ({}): {e}", format.name());
            continue;
        }
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_function(format!("{}/{name}", format.name()), |b| {
            b.iter(|| trace::read_bytes(black_box(&data), format, &options(false)))
        });
    }
    g.finish();
}

criterion_group!(benches, largest_snapshot, repeated_snapshot, fst, every_real_trace);
criterion_main!(benches);
