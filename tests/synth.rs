//! Integration tests: `fragsim synth` and the bundled synthetic trace.
//!
//! The tiny model used throughout (1 block, hidden 16, 2 heads, vocab 32, seq 3, batch 2) has,
//! counted by hand from nanoGPT's modules: wte 32·16 = 512, wpe 3·16 = 48, one block
//! 12·16² + 13·16 = 3280, ln_f 2·16 = 32, so 3872 parameters = 15,488 fp32 bytes in 16 tensors.
//! Its token ids are 2·3·8 = 48 bytes (ids and targets; no other tensor has that size) and its
//! attention scores 2·2·3·3 = 36 elements.

use crate::util::*;
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::synth::{generate, SynthConfig};
use fragsim::trace::{Action, Event, Trace};
use std::collections::HashMap;

const TINY_PARAMS: u64 = 3872;
const TINY_PARAM_TENSORS: usize = 16;
const TINY_IDS_BYTES: u64 = 48;

fn tiny() -> SynthConfig {
    SynthConfig {
        layers: 1,
        hidden: 16,
        heads: 2,
        vocab: 32,
        seq: 3,
        batch: 2,
        steps: 1,
        ..SynthConfig::default()
    }
}

fn events(config: &SynthConfig) -> Vec<Event> {
    let (trace, _) = generate(config).expect("valid config");
    assert_eq!(trace.devices.len(), 1);
    trace.devices[0].events.clone()
}

fn alloc_sizes(events: &[Event]) -> Vec<u64> {
    events.iter().filter(|e| e.action == Action::Alloc).map(|e| e.size).collect()
}

/// Live bytes just before the `n`th (0-based) alloc of `size` bytes.
fn live_before_nth_alloc_of(events: &[Event], size: u64, n: usize) -> u64 {
    let mut live = 0u64;
    let mut seen = 0;
    for e in events {
        match e.action {
            Action::Alloc if e.size == size => {
                if seen == n {
                    return live;
                }
                seen += 1;
                live += e.size;
            }
            Action::Alloc => live += e.size,
            Action::FreeCompleted => live -= e.size,
            _ => {}
        }
    }
    panic!("fewer than {} allocs of {size} bytes", n + 1)
}

/// Checks the events are what PyTorch records and returns (tensors, bytes) live at the end.
fn check_well_formed(events: &[Event]) -> (usize, u64) {
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut ever = std::collections::HashSet::new();
    let mut last_time = i64::MIN;
    let mut i = 0;
    while i < events.len() {
        let e = events[i];
        assert!(e.time_us >= last_time, "event {i}: time goes back");
        last_time = e.time_us;
        match e.action {
            Action::Alloc => {
                assert!(e.size > 0, "event {i}: zero-byte alloc");
                assert!(ever.insert(e.addr), "event {i}: address {:#x} reused", e.addr);
                live.insert(e.addr, (e.size, e.stream));
                i += 1;
            }
            Action::FreeRequested => {
                assert_eq!(live.remove(&e.addr), Some((e.size, e.stream)), "event {i}");
                let next = events.get(i + 1).expect("free_completed follows");
                assert_eq!(
                    (next.action, next.addr, next.size, next.stream),
                    (Action::FreeCompleted, e.addr, e.size, e.stream),
                    "event {i}"
                );
                i += 2;
            }
            other => panic!("event {i}: unexpected {other:?}"),
        }
    }
    (live.len(), live.values().map(|&(s, _)| s).sum())
}

fn bound_peak(trace: &Trace) -> u64 {
    let input = ReplayInput::new(trace, None).unwrap();
    let spec = &PolicySpec::parse_list("bound").unwrap()[0];
    let out = policy::lookup(&spec.name).unwrap().run(spec, &input, &ReplayOptions::default());
    out.unwrap().result.peak_reserved_bytes
}

#[test]
fn parameters_come_first_with_their_exact_byte_count() {
    let sizes = alloc_sizes(&events(&tiny()));
    assert_eq!(sizes[..TINY_PARAM_TENSORS].iter().sum::<u64>(), TINY_PARAMS * 4);
    assert_eq!(sizes[TINY_PARAM_TENSORS], TINY_IDS_BYTES, "then the token ids");
    // Mixed precision: 2-byte model weights, then the fp32 master copies.
    let sizes = alloc_sizes(&events(&SynthConfig { mixed_precision: true, ..tiny() }));
    assert_eq!(sizes[..TINY_PARAM_TENSORS].iter().sum::<u64>(), TINY_PARAMS * 2);
    let masters = &sizes[TINY_PARAM_TENSORS..2 * TINY_PARAM_TENSORS];
    assert_eq!(masters.iter().sum::<u64>(), TINY_PARAMS * 4);
    assert_eq!(sizes[2 * TINY_PARAM_TENSORS], TINY_IDS_BYTES);
}

#[test]
fn mixed_precision_halves_the_attention_scores() {
    // Five score-sized tensors in a block's forward (q·kᵀ, scaled, masked, softmax, dropout)
    // and five gradients in its backward: 10 per block per micro-batch; 2 blocks × 2 steps = 40.
    let config = SynthConfig { layers: 2, steps: 2, ..tiny() };
    let count = |sizes: &[u64], n: u64| sizes.iter().filter(|&&s| s == n).count();
    let fp32 = alloc_sizes(&events(&config));
    assert_eq!(count(&fp32, 36 * 4), 40);
    let mixed = alloc_sizes(&events(&SynthConfig { mixed_precision: true, ..config }));
    assert_eq!(count(&mixed, 36 * 2), 40);
    assert_eq!(count(&mixed, 36 * 4), 0);
}

#[test]
fn gradients_stay_live_across_accumulated_micro_batches() {
    // Before the second micro-batch's ids (the third 48-byte alloc, after ids and targets):
    // with accumulation, parameters + gradients; without, after one optimizer step,
    // parameters + exp_avg + exp_avg_sq (zero_grad freed the gradients).
    let accum = events(&SynthConfig { grad_accum: 2, ..tiny() });
    assert_eq!(live_before_nth_alloc_of(&accum, TINY_IDS_BYTES, 2), 2 * TINY_PARAMS * 4);
    let steps = events(&SynthConfig { steps: 2, ..tiny() });
    assert_eq!(live_before_nth_alloc_of(&steps, TINY_IDS_BYTES, 2), 3 * TINY_PARAMS * 4);
}

#[test]
fn checkpointing_lowers_the_peak_measured_by_bound() {
    // Deep and narrow with a small vocabulary: saved activations dominate the peak.
    let config = SynthConfig {
        layers: 8,
        hidden: 64,
        heads: 4,
        vocab: 64,
        seq: 64,
        batch: 16,
        steps: 1,
        ..SynthConfig::default()
    };
    let plain = bound_peak(&generate(&config).unwrap().0);
    let ckpt = bound_peak(&generate(&SynthConfig { checkpointing: true, ..config }).unwrap().0);
    // With U = b·t·h·4 bytes = 256 KiB (and b·a·t·t·4 = 4U here), a block saves 24.5U (ln outs,
    // qkv 3U, softmax and dropout 8U + mask U, y, x_mid, fc and gelu 8U, masks) plus its
    // output U, so 8 blocks keep 204U = 51 MiB at the end of forward. Checkpointed, they keep
    // 8U, and backward adds one recomputed block (24.5U) and its gradients: under 50U. The
    // parameters (408,192 × 4 bytes) and the optimizer step (5 × that) are far below both.
    assert!(ckpt * 2 < plain, "checkpointed {ckpt} vs plain {plain}");
}

#[test]
fn every_alloc_is_freed_once_or_live_at_the_end_as_designed() {
    // fp32: parameters and AdamW's two states stay: 3 × 16 tensors, 3 × 15,488 bytes.
    let (n, bytes) = check_well_formed(&events(&SynthConfig { steps: 2, ..tiny() }));
    assert_eq!((n, bytes), (3 * TINY_PARAM_TENSORS, 3 * TINY_PARAMS * 4));
    // Mixed precision adds the 2-byte model weights beside the fp32 masters.
    let all = SynthConfig {
        steps: 3,
        mixed_precision: true,
        grad_accum: 2,
        checkpointing: true,
        vary_seq: Some((1, 3)),
        streams: 3,
        ..tiny()
    };
    let (n, bytes) = check_well_formed(&events(&all));
    assert_eq!((n, bytes), (4 * TINY_PARAM_TENSORS, TINY_PARAMS * (2 + 4 + 4 + 4)));
}

#[test]
fn side_streams_carry_one_bucket_of_all_gradients_per_step() {
    // 15,488 gradient bytes fit in one 25 MiB DDP bucket, allocated on stream 1 at each step's
    // last micro-batch only.
    let e = events(&SynthConfig { streams: 2, steps: 2, grad_accum: 2, ..tiny() });
    let side: Vec<u64> = e
        .iter()
        .filter(|e| e.action == Action::Alloc && e.stream != 0)
        .map(|e| {
            assert_eq!(e.stream, 1);
            e.size
        })
        .collect();
    assert_eq!(side, [TINY_PARAMS * 4, TINY_PARAMS * 4]);
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let config = SynthConfig { steps: 4, vary_seq: Some((1, 3)), seed: 7, ..tiny() };
    assert_eq!(generate(&config).unwrap().0, generate(&config).unwrap().0);
    let other = SynthConfig { seed: 8, ..config.clone() };
    assert_ne!(generate(&config).unwrap().0, generate(&other).unwrap().0);
    // A range of one length draws nothing that matters.
    let fixed = SynthConfig { vary_seq: Some((3, 3)), ..config.clone() };
    let plain = SynthConfig { vary_seq: None, ..config };
    assert_eq!(generate(&fixed).unwrap().0, generate(&plain).unwrap().0);
}

#[test]
fn bad_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.txt");
    let out = out.to_str().unwrap();
    let o = run(&["synth", out, "--hidden", "10", "--heads", "3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--heads 3 does not divide --hidden 10"), "{}", stderr(&o));
    let o = run(&["synth", out, "--vary-seq", "300:100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("expected MIN:MAX"), "{}", stderr(&o));
    let o = run(&["synth", out, "--seq", "128", "--vary-seq", "64:256"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("MAX <= --seq (128)"), "{}", stderr(&o));
    assert!(!dir.path().join("t.txt").exists());
}

/// The `fragsim synth ...` line of `traces/README.md`.
fn readme_command() -> Vec<String> {
    let readme = std::fs::read_to_string(bundled("README.md")).unwrap();
    let line = readme.lines().find(|l| l.starts_with("fragsim synth ")).expect("a synth line");
    line.split_whitespace().skip(1).map(str::to_string).collect()
}

#[test]
fn the_bundled_trace_is_what_its_readme_command_makes() {
    let mut args = readme_command();
    assert_eq!(args[1], "traces/gpt-4l-512h.txt");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt-4l-512h.txt");
    args[1] = out.to_str().unwrap().to_string();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("wrote 2946 events"), "{}", stdout(&o));
    let made = std::fs::read(&out).unwrap();
    let shipped = std::fs::read(bundled("gpt-4l-512h.txt")).unwrap();
    assert!(made == shipped, "regenerate traces/gpt-4l-512h.txt with the README's command");
}

#[test]
fn the_bundled_trace_replays() {
    let path = bundled("gpt-4l-512h.txt");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["events"], 2946);
    let r = &v["results"][0];
    // Parameters (38,473,216 fp32) and both AdamW states stay live: 3 × 153,892,864 bytes.
    assert_eq!(r["reserved_at_end_bytes"], 3 * 38_473_216 * 4);
    assert_eq!(r["peak_reserved_bytes"], r["peak_requested_bytes"]);
    assert_eq!(r["oom"], false);
}
