//! Synthetic training traces: the allocation events of a GPT-2-style transformer's training
//! steps, as PyTorch's CUDA caching allocator would record them (`fragsim synth`).
//!
//! Real traces are the better evidence (Wilson et al. 1995: synthetic random traces mislead),
//! so this generator does not draw random sizes: it walks the tensors a real training step makes,
//! in the order autograd makes and frees them, with sizes from the real shapes
//! (bytes = numel × dtype size). The model is nanoGPT's GPT-2 (`model.py` in karpathy/nanoGPT):
//! token and learned position embeddings, pre-LayerNorm blocks with materialised causal attention
//! (scores of batch × heads × seq × seq), a GELU MLP of width 4 × hidden, dropout everywhere, a
//! final LayerNorm and an LM head tied to the token embedding; the optimizer is
//! `torch.optim.AdamW` with its default multi-tensor (`foreach`) implementation.
//!
//! What one optimizer step records, on the compute stream (see [`gpt`] for every tensor):
//!
//! - **once, at the start:** every parameter, in module order (and, with
//!   [`SynthConfig::mixed_precision`], the 2-byte model weights first and then the 4-byte master
//!   copies the optimizer updates); they stay live to the end;
//! - **per micro-batch:** the token ids and targets (int64); the forward pass, where activations
//!   saved for backward stay live and temporaries are freed right after their consumer; the loss
//!   (log-softmax over batch × seq × vocab, in fp32 under mixed precision); the backward pass,
//!   freeing saved activations in reverse order and creating each parameter's gradient on first
//!   use, or adding into it and freeing the new one when gradients accumulate
//!   ([`SynthConfig::grad_accum`]);
//! - **the optimizer step:** AdamW's `exp_avg` and `exp_avg_sq` (fp32, allocated at the first
//!   step and kept), the `_foreach_sqrt` temporaries (one per parameter, all live together), the
//!   fp32 copies of 2-byte gradients under mixed precision, then `zero_grad(set_to_none=True)`
//!   freeing every gradient.
//!
//! With [`SynthConfig::checkpointing`] each block runs as `torch.utils.checkpoint` does: the
//! forward keeps only the block's input, and backward recomputes the block before its gradient.
//! With [`SynthConfig::streams`] > 1, the last micro-batch's backward also allocates
//! DistributedDataParallel-style 25 MiB gradient buckets on side streams as gradients become
//! ready, freed when backward ends (after the all-reduce would have finished).
//!
//! Every allocation gets a fresh, never reused, 512-byte-aligned fake address (the replay engine
//! maps recorded addresses to policy addresses, so uniqueness is all it needs). Each free is a
//! `free_requested` followed by a `free_completed` at the same time, as PyTorch records a free with
//! no pending stream uses. Times are microseconds, advanced by a simple cost model (a kernel
//! launch, bytes written at 1 TB/s, matmul FLOPs at 100 TFLOP/s), so the time axis of plots looks
//! like a training run. The same configuration and seed always give the same trace.
//!
//! Deviations from a real run, on purpose: no CUDA context, cuBLAS workspace or NCCL buffers (they
//! are not allocator blocks); no causal-mask buffer; `loss / grad_accum` scaling and the `step`
//! counters are left out (scalars on the host or of a few bytes).

pub mod gpt;

use crate::error::{Cancel, Error, Result};
use crate::trace::{Action, DeviceTrace, Event, Format, Trace};

/// The model, batch and run a synthetic trace describes. `Default` is the small GPT the bundled
/// trace uses (4 layers, hidden 512, GPT-2's vocabulary).
#[derive(Clone, Debug)]
pub struct SynthConfig {
    /// Transformer blocks.
    pub layers: u64,
    /// Hidden size (embedding width); the MLP is 4 × hidden wide.
    pub hidden: u64,
    /// Attention heads; must divide `hidden`.
    pub heads: u64,
    /// Vocabulary size (rows of the token embedding, columns of the logits).
    pub vocab: u64,
    /// Context length: rows of the position embedding, and every sequence's length unless
    /// `vary_seq` is set.
    pub seq: u64,
    /// Sequences per micro-batch.
    pub batch: u64,
    /// Optimizer steps.
    pub steps: u64,
    /// 2-byte (bf16/fp16) weights, activations and gradients, with 4-byte master weights and
    /// optimizer state (the apex O2 / Megatron recipe).
    pub mixed_precision: bool,
    /// Micro-batches per optimizer step; gradients accumulate across them.
    pub grad_accum: u64,
    /// Activation checkpointing per block: keep only block inputs, recompute in backward.
    pub checkpointing: bool,
    /// Draw each micro-batch's sequence length uniformly from `[min, max]` (max ≤ `seq`): the
    /// variable-length batches that fragment real caches.
    pub vary_seq: Option<(u64, u64)>,
    /// Seed of the sequence-length draws.
    pub seed: u64,
    /// CUDA streams: 1 is the compute stream only; more adds gradient buckets on side streams.
    pub streams: u64,
    /// Raised by another thread to stop generating early (the Python package raises it on
    /// Ctrl-C): looked at once per transformer block and micro-batch, and then [`generate`]
    /// fails naming the event it reached. Not part of the trace described; never raised by
    /// default.
    pub cancel: Cancel,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            layers: 4,
            hidden: 512,
            heads: 8,
            vocab: 50257,
            seq: 256,
            batch: 8,
            steps: 3,
            mixed_precision: false,
            grad_accum: 1,
            checkpointing: false,
            vary_seq: None,
            seed: 0,
            streams: 1,
            cancel: Cancel::default(),
        }
    }
}

/// The largest tensor the generator agrees to describe (1 PiB): beyond any GPU, and far from u64
/// overflow in the size arithmetic.
const MAX_TENSOR_BYTES: u64 = 1 << 50;
/// The most events a trace may hold, by the estimate in [`SynthConfig::validate`] (500 events per
/// block and micro-batch, about three times what the generator makes): 10 GB at 40 bytes an
/// event, so a 50 M-event trace (about 53,000 steps of the default model) fits with room.
const MAX_EVENTS: u64 = 250_000_000;

impl SynthConfig {
    /// Checks the configuration: every count ≥ 1, heads divide hidden, the sequence range fits the
    /// context, and no tensor or trace is absurdly large. Errors are usage errors naming the flag.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("--layers", self.layers),
            ("--hidden", self.hidden),
            ("--heads", self.heads),
            ("--vocab", self.vocab),
            ("--seq", self.seq),
            ("--batch", self.batch),
            ("--steps", self.steps),
            ("--grad-accum", self.grad_accum),
            ("--streams", self.streams),
        ] {
            if v == 0 {
                return Err(Error::usage(format!("{name} must be at least 1")));
            }
        }
        if self.hidden % self.heads != 0 {
            return Err(Error::usage(format!(
                "--heads {} does not divide --hidden {}",
                self.heads, self.hidden
            )));
        }
        if let Some((lo, hi)) = self.vary_seq {
            if lo == 0 || lo > hi || hi > self.seq {
                return Err(Error::usage(format!(
                    "--vary-seq {lo}:{hi}: expected 1 <= MIN <= MAX <= --seq ({})",
                    self.seq
                )));
            }
        }
        let too_big = || {
            Error::usage(format!(
                "the model is too large to describe: a tensor would exceed {} bytes",
                MAX_TENSOR_BYTES
            ))
        };
        let product = |xs: &[u64]| {
            xs.iter()
                .try_fold(1u64, |acc, &x| acc.checked_mul(x))
                .filter(|&p| p <= MAX_TENSOR_BYTES)
                .ok_or_else(too_big)
        };
        let (b, t, h) = (self.batch, self.seq, self.hidden);
        product(&[b, self.heads, t, t, 4])?; // attention scores
        product(&[b, t, self.vocab, 4])?; // log-softmax over the logits
        product(&[b, t, 4, h, 4])?; // MLP activations
        product(&[self.vocab, h, 4])?; // token embedding
        product(&[self.layers, 12, h, h, 4])?; // all blocks' weights
        let events = product(&[self.steps, self.grad_accum, self.layers + 2, 500])
            .ok()
            .filter(|&e| e <= MAX_EVENTS);
        if events.is_none() {
            return Err(Error::usage(format!(
                "--steps × --grad-accum × --layers is too large: the trace would exceed {MAX_EVENTS} events"
            )));
        }
        Ok(())
    }

    /// The parameter count: token and position embeddings, 12·h² + 13·h per block, and the final
    /// LayerNorm (the LM head shares the token embedding's weight).
    pub fn parameter_count(&self) -> u64 {
        gpt::parameter_shapes(self).iter().sum()
    }
}

/// Parses `--vary-seq MIN:MAX` (both positive integers, MIN ≤ MAX).
pub fn parse_seq_range(text: &str) -> Result<(u64, u64)> {
    let bad =
        || Error::usage(format!("invalid sequence range '{text}': expected MIN:MAX, e.g. 64:512"));
    let (lo, hi) = text.split_once(':').ok_or_else(bad)?;
    let lo: u64 = lo.trim().parse().map_err(|_| bad())?;
    let hi: u64 = hi.trim().parse().map_err(|_| bad())?;
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// What a generated trace holds, for the command's summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynthSummary {
    /// Events in the trace.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// The largest sum of live allocation sizes.
    pub peak_live_bytes: u64,
    /// Bytes still allocated when the trace ends (parameters and optimizer state).
    pub live_at_end_bytes: u64,
}

/// Generates the trace `config` describes (device 0), with a summary of what it holds.
pub fn generate(config: &SynthConfig) -> Result<(Trace, SynthSummary)> {
    config.validate()?;
    let mut rec = Recorder::new(config.seed, config.cancel.clone());
    gpt::train(config, &mut rec);
    let made = rec.events.len();
    config.cancel.check(|| format!("generating the synthetic trace at event {made}"))?;
    let summary = SynthSummary {
        events: rec.events.len() as u64,
        allocs: rec.allocs,
        peak_live_bytes: rec.peak_live,
        live_at_end_bytes: rec.live,
    };
    let trace = Trace {
        format: Format::Text,
        devices: vec![DeviceTrace { device: 0, events: rec.events }],
        has_times: true,
        ..Trace::default()
    };
    Ok((trace, summary))
}

/// One allocation as the generator tracks it: the block PyTorch would have handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tensor {
    addr: u64,
    size: u64,
    stream: u64,
}

/// Where fake addresses start (high, as on real GPUs).
const FIRST_ADDRESS: u64 = 0x7f00_0000_0000;
/// Fake addresses advance in PyTorch's block granularity.
const ADDRESS_STEP: u64 = 512;
/// The first event's time: 2026-01-01T00:00:00Z in microseconds since the Unix epoch.
const START_TIME_US: i64 = 1_767_225_600_000_000;

/// Records allocator events while the model code runs: fresh addresses, a clock and live bytes.
struct Recorder {
    events: Vec<Event>,
    next_addr: u64,
    /// Time in nanoseconds (events record microseconds), so many tiny kernels still add up.
    now_ns: u64,
    live: u64,
    peak_live: u64,
    allocs: u64,
    rng: SplitMix64,
    /// Looked at by [`Recorder::halted`].
    cancel: Cancel,
}

impl Recorder {
    fn new(seed: u64, cancel: Cancel) -> Recorder {
        Recorder {
            events: Vec::new(),
            next_addr: FIRST_ADDRESS,
            now_ns: 0,
            live: 0,
            peak_live: 0,
            allocs: 0,
            rng: SplitMix64(seed),
            cancel,
        }
    }

    /// True once the cancel flag is raised: the model code then stops where it is.
    fn halted(&self) -> bool {
        self.cancel.is_cancelled()
    }

    fn time_us(&self) -> i64 {
        START_TIME_US + (self.now_ns / 1000) as i64
    }

    /// Allocates `bytes` on the compute stream (stream 0) and charges writing them.
    fn alloc(&mut self, bytes: u64) -> Tensor {
        self.alloc_on(bytes, 0)
    }

    /// Allocates `bytes` on `stream`: one `alloc` event at a fresh address.
    fn alloc_on(&mut self, bytes: u64, stream: u64) -> Tensor {
        let t = Tensor { addr: self.next_addr, size: bytes, stream };
        self.next_addr += bytes.div_ceil(ADDRESS_STEP).max(1) * ADDRESS_STEP;
        self.events.push(Event::new(Action::Alloc, t.addr, t.size, t.stream, self.time_us()));
        self.allocs += 1;
        self.live += bytes;
        self.peak_live = self.peak_live.max(self.live);
        // A kernel launch (2 µs), then the output written at 1 TB/s (1000 bytes per ns).
        self.now_ns += 2_000 + bytes / 1_000;
        t
    }

    /// Frees `t`: `free_requested` then `free_completed`, as PyTorch records an uncontended free.
    fn free(&mut self, t: Tensor) {
        let now = self.time_us();
        self.events.push(Event::new(Action::FreeRequested, t.addr, t.size, t.stream, now));
        self.events.push(Event::new(Action::FreeCompleted, t.addr, t.size, t.stream, now));
        self.live -= t.size;
    }

    /// Charges a matmul of `flops` floating-point operations at 100 TFLOP/s.
    fn compute(&mut self, flops: u64) {
        self.now_ns += flops / 100_000;
    }

    /// Lets host time pass (data loading between micro-batches).
    fn idle(&mut self, micros: u64) {
        self.now_ns += micros * 1_000;
    }

    /// A uniform draw from `[lo, hi]`.
    fn uniform(&mut self, lo: u64, hi: u64) -> u64 {
        // Modulo bias is at most (hi - lo + 1) / 2^64: irrelevant for sequence lengths.
        lo + self.rng.next() % (hi - lo + 1)
    }
}

/// Steele, Lea and Flood's SplitMix64: a tiny, well-mixed generator, reproducible everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_ranges_parse_and_reject_nonsense() {
        assert_eq!(parse_seq_range("64:512").unwrap(), (64, 512));
        assert_eq!(parse_seq_range("8:8").unwrap(), (8, 8));
        for bad in ["", "64", "512:64", "0:4", "a:b", "1:2:3"] {
            let e = parse_seq_range(bad).unwrap_err();
            assert!(e.message().contains("expected MIN:MAX"), "{bad}: {e}");
        }
    }

    #[test]
    fn validation_names_the_flag() {
        let c = SynthConfig { heads: 3, ..SynthConfig::default() };
        assert!(c.validate().unwrap_err().message().contains("--heads 3 does not divide"));
        let c = SynthConfig { layers: 0, ..SynthConfig::default() };
        assert!(c.validate().unwrap_err().message().contains("--layers must be at least 1"));
        let c = SynthConfig { vary_seq: Some((64, 512)), ..SynthConfig::default() };
        assert!(c.validate().unwrap_err().message().contains("MAX <= --seq (256)"));
        let c = SynthConfig { vocab: u64::MAX / 2, ..SynthConfig::default() };
        assert!(c.validate().unwrap_err().message().contains("too large"));
        let c = SynthConfig { steps: 1 << 40, ..SynthConfig::default() };
        assert!(c.validate().unwrap_err().message().contains("events"));
    }

    #[test]
    fn gpt2_small_has_its_published_parameter_count() {
        // GPT-2 small: 12 layers, 768 hidden, 50257 vocab, 1024 positions = 124,439,808
        // parameters (nanoGPT prints "number of parameters: 124.44M" with wpe counted).
        let c = SynthConfig {
            layers: 12,
            hidden: 768,
            heads: 12,
            vocab: 50257,
            seq: 1024,
            ..SynthConfig::default()
        };
        assert_eq!(c.parameter_count(), 124_439_808);
    }

    #[test]
    fn recorder_gives_unique_aligned_addresses_and_balanced_frees() {
        let mut r = Recorder::new(0, Cancel::default());
        let a = r.alloc(1);
        let b = r.alloc(513);
        let c = r.alloc(4);
        assert_eq!((b.addr - a.addr, c.addr - b.addr), (512, 1024));
        r.free(b);
        assert_eq!(r.live, 5);
        assert_eq!(r.peak_live, 518);
        let actions: Vec<Action> = r.events.iter().map(|e| e.action).collect();
        assert_eq!(actions[3..], [Action::FreeRequested, Action::FreeCompleted]);
    }
}
