//! Reading speed (MB/s of decompressed input) per trace format, on the real traces in
//! `../shared/traces/`.
//!
//! The headline is the largest PyTorch snapshot with and without frames (the Python baseline is
//! `pickle.load` at ≈ 18 MB/s with its garbage collector on, ≈ 69 MB/s without, rust-deps §3).
//! Every other shared trace is read through `trace::read_bytes` after content detection; a format
//! whose reader is still a stub is skipped with a note. Missing traces are skipped too, so the
//! bench runs anywhere.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fragsim::trace::{self, detect, Format, ReadOptions};
use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn shared(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real").join(name)
}

/// The file's bytes, gunzipped when compressed (the readers see decompressed data).
fn load(path: &Path) -> Option<Vec<u8>> {
    let raw = std::fs::read(path).ok()?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out).ok()?;
        Some(out)
    } else {
        Some(raw)
    }
}

fn options(keep_frames: bool) -> ReadOptions {
    ReadOptions { keep_frames, progress: false }
}

fn largest_snapshot(c: &mut Criterion) {
    let Some(data) = load(&shared("cs336-medium-ctx512-train.pickle")) else {
        eprintln!("skipping: ../shared/traces/cs336-medium-ctx512-train.pickle not found");
        return;
    };
    let mut g = c.benchmark_group("snapshot");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.measurement_time(Duration::from_secs(5));
    for (label, keep_frames) in [("no-frames", false), ("frames", true)] {
        g.bench_function(format!("cs336-medium-ctx512-train/{label}"), |b| {
            b.iter(|| {
                trace::read_bytes(black_box(&data), Format::PytorchSnapshot, &options(keep_frames))
                    .expect("the shared snapshot reads")
            })
        });
    }
    g.bench_function("cs336-medium-ctx512-train/pickle-decode-only", |b| {
        b.iter(|| fragsim::trace::pickle::decode(black_box(&data)).expect("decodes").root())
    });
    g.finish();
}

fn every_shared_trace(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
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
        let Some(data) = load(&path) else { continue };
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

criterion_group!(benches, largest_snapshot, every_shared_trace);
criterion_main!(benches);
