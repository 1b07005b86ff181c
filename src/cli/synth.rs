//! `fragsim synth`: writes a synthetic GPT training trace (see `fragsim::synth`).

use fragsim::error::{Error, Result};
use fragsim::synth::{self, SynthConfig};
use fragsim::units::format_bytes;
use std::path::PathBuf;

/// Write a synthetic transformer-training trace.
///
/// The allocations of a GPT-2-style model's training steps as PyTorch's caching allocator sees
/// them: parameters, gradients, AdamW state, activations saved for backward, temporaries and the
/// loss, with sizes from the real tensor shapes. The same flags and seed give the same trace.
/// The output format follows OUT's extension (.txt, .fst, .pickle, .csv; .gz compresses).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the trace.
    #[arg(value_name = "OUT")]
    out: PathBuf,

    /// Transformer blocks.
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().layers)]
    layers: u64,

    /// Hidden size (the MLP is 4 × hidden wide).
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().hidden)]
    hidden: u64,

    /// Attention heads (must divide --hidden).
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().heads)]
    heads: u64,

    /// Vocabulary size.
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().vocab)]
    vocab: u64,

    /// Context length (position-embedding rows; every sequence's length unless --vary-seq).
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().seq)]
    seq: u64,

    /// Sequences per micro-batch.
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().batch)]
    batch: u64,

    /// Optimizer steps.
    #[arg(long, value_name = "N", default_value_t = SynthConfig::default().steps)]
    steps: u64,

    /// 2-byte weights, activations and gradients; 4-byte master weights and optimizer state.
    #[arg(long)]
    mixed_precision: bool,

    /// Micro-batches per optimizer step; gradients accumulate across them.
    #[arg(long, value_name = "K", default_value_t = 1)]
    grad_accum: u64,

    /// Activation checkpointing: keep only block inputs, recompute blocks in backward.
    #[arg(long)]
    checkpointing: bool,

    /// Draw each micro-batch's sequence length from MIN..=MAX (MAX ≤ --seq).
    #[arg(long, value_name = "MIN:MAX", value_parser = seq_range_arg)]
    vary_seq: Option<(u64, u64)>,

    /// Seed of the sequence-length draws.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,

    /// CUDA streams; more than 1 adds DDP-style gradient buckets on side streams.
    #[arg(long, value_name = "N", default_value_t = 1)]
    streams: u64,
}

fn seq_range_arg(text: &str) -> std::result::Result<(u64, u64), String> {
    synth::parse_seq_range(text).map_err(|e| e.message().to_string())
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let config = SynthConfig {
        layers: args.layers,
        hidden: args.hidden,
        heads: args.heads,
        vocab: args.vocab,
        seq: args.seq,
        batch: args.batch,
        steps: args.steps,
        mixed_precision: args.mixed_precision,
        grad_accum: args.grad_accum,
        checkpointing: args.checkpointing,
        vary_seq: args.vary_seq,
        seed: args.seed,
        streams: args.streams,
        cancel: io.cancel.clone(),
    };
    config.validate()?;
    fragsim::report::output::refuse_input(&args.out, "OUT", &[])?;
    let (trace, summary) = synth::generate(&config)?;
    fragsim::report::output::write_output(&args.out, "OUT", |w| {
        fragsim::trace::write_trace_into(&trace, &args.out, w, &io.cancel)
    })?;
    writeln!(
        io.out,
        "wrote {} events ({} allocs; {} parameters; peak live {}; {} live at end) to {}",
        summary.events,
        summary.allocs,
        config.parameter_count(),
        format_bytes(summary.peak_live_bytes),
        format_bytes(summary.live_at_end_bytes),
        args.out.display()
    )
    .map_err(|e| Error::writing("to stdout", e))?;
    Ok(0)
}
