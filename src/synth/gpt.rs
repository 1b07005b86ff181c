//! The tensors of one GPT-2 training step, in the order PyTorch's autograd allocates and frees
//! them (nanoGPT's `model.py`, `torch.optim.AdamW` with `foreach=True`).
//!
//! Shapes use `b` batch, `t` this micro-batch's sequence length, `h` hidden, `a` heads, `v` vocab,
//! `ctx` the context length (position-embedding rows) and `d` the bytes of an activation, gradient
//! or model weight (4, or 2 under mixed precision). LayerNorm's saved mean and rstd are fp32 (the
//! accumulate type) in both cases; dropout masks are bool (1 byte); token ids are int64.
//!
//! A block's forward, with the tensors autograd saves for backward marked *saved*:
//!
//! | op | output (bytes) | frees |
//! |---|---|---|
//! | `ln_1(x)` | out *saved* b·t·h·d, mean and rstd *saved* b·t·4 each | |
//! | `c_attn` | qkv *saved* b·t·3h·d (q, k and v are views of it) | |
//! | `q @ kᵀ`, `* scale`, `masked_fill` | b·a·t·t·d each | the previous one |
//! | `softmax` | *saved* b·a·t·t·d | the masked scores |
//! | `attn_dropout` | mask *saved* b·a·t·t, out *saved* b·a·t·t·d | |
//! | `att @ v`, `transpose().contiguous()` | b·t·h·d, then y *saved* b·t·h·d | `att @ v`'s output |
//! | `c_proj`, `resid_dropout` | b·t·h·d, mask *saved* b·t·h, out b·t·h·d | `c_proj`'s output |
//! | `x + ...` | x_mid *saved* b·t·h·d | the dropout output |
//! | `ln_2` | out *saved* b·t·h·d, mean and rstd *saved* | |
//! | `c_fc`, `gelu` | *saved* b·t·4h·d each | |
//! | `c_proj`, `dropout`, `x_mid + ...` | b·t·h·d, mask *saved*, out, block output b·t·h·d | as above |
//!
//! Backward walks the same list in reverse: each op allocates its input gradients (and its
//! parameters' gradients), then frees its saved tensors and the incoming gradient. Under
//! checkpointing the forward frees the *saved* tensors as soon as the forward is done with them,
//! and backward first runs the block's forward again, keeping them.

use super::{Recorder, SynthConfig, Tensor};

/// Parameters per transformer block (weights and biases of two LayerNorms and four Linears).
const BLOCK_PARAMS: usize = 12;
// A block's parameters in registration order (nanoGPT `Block`).
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const ATTN_W: usize = 2;
const ATTN_B: usize = 3;
const ATTN_PROJ_W: usize = 4;
const ATTN_PROJ_B: usize = 5;
const LN2_W: usize = 6;
const LN2_B: usize = 7;
const FC_W: usize = 8;
const FC_B: usize = 9;
const MLP_PROJ_W: usize = 10;
const MLP_PROJ_B: usize = 11;
/// The token embedding (also the LM head's weight).
const WTE: usize = 0;
/// The position embedding.
const WPE: usize = 1;
/// DistributedDataParallel's default `bucket_cap_mb`.
const BUCKET_BYTES: u64 = 25 << 20;

/// The element count of every parameter, in `model.parameters()` order: `wte`, `wpe`, each
/// block's twelve, then `ln_f`'s weight and bias.
pub(crate) fn parameter_shapes(c: &SynthConfig) -> Vec<u64> {
    let h = c.hidden;
    let mut shapes = vec![c.vocab * h, c.seq * h];
    for _ in 0..c.layers {
        shapes.extend([h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]);
    }
    shapes.extend([h, h]);
    shapes
}

/// Runs `config`'s whole training run through `rec`, or stops early (with the run half done)
/// once the recorder's cancel flag is raised: it is looked at once per block and micro-batch.
pub(super) fn train(config: &SynthConfig, rec: &mut Recorder) {
    let mut trainer = Trainer::new(config, rec);
    for _ in 0..config.steps {
        for micro in 0..config.grad_accum {
            let t = match config.vary_seq {
                Some((lo, hi)) => trainer.rec.uniform(lo, hi),
                None => config.seq,
            };
            trainer.rec.idle(500); // the data loader hands over the next batch
            let sync = config.streams > 1 && micro + 1 == config.grad_accum;
            trainer.micro_batch(t, sync);
            if trainer.rec.halted() {
                return; // cancelled: the run is abandoned half way
            }
        }
        trainer.optimizer_step();
    }
}

/// What a block's forward saved for its backward (see the module docs).
struct Saved {
    ln1_out: Tensor,
    ln1_mean: Tensor,
    ln1_rstd: Tensor,
    qkv: Tensor,
    softmax: Tensor,
    att_mask: Tensor,
    att: Tensor,
    y: Tensor,
    attn_drop_mask: Tensor,
    x_mid: Tensor,
    ln2_out: Tensor,
    ln2_mean: Tensor,
    ln2_rstd: Tensor,
    fc: Tensor,
    gelu: Tensor,
    mlp_drop_mask: Tensor,
}

/// DDP-style gradient buckets of the syncing micro-batch.
struct Buckets {
    /// Gradient bytes ready but not yet in a bucket.
    filled: u64,
    /// Which parameters' gradients are already counted.
    ready: Vec<bool>,
    /// Buckets allocated this backward, freed when it ends.
    pending: Vec<Tensor>,
    /// The next side stream to use (1 ..= streams - 1, round robin).
    next_stream: u64,
}

struct Trainer<'a> {
    c: &'a SynthConfig,
    rec: &'a mut Recorder,
    shapes: Vec<u64>,
    /// Bytes of an activation, gradient or model weight.
    d: u64,
    /// Each parameter's `.grad`, if set since the last `zero_grad`.
    grads: Vec<Option<Tensor>>,
    /// AdamW's state exists (it is created at the first step).
    optimizer_state: bool,
    /// Set while the syncing micro-batch's backward runs with several streams.
    buckets: Option<Buckets>,
}

impl<'a> Trainer<'a> {
    /// Allocates the parameters (and master weights): they stay live to the end.
    fn new(c: &'a SynthConfig, rec: &'a mut Recorder) -> Trainer<'a> {
        let shapes = parameter_shapes(c);
        let d = if c.mixed_precision { 2 } else { 4 };
        for &n in &shapes {
            rec.alloc(n * d);
        }
        if c.mixed_precision {
            for &n in &shapes {
                rec.alloc(n * 4);
            }
        }
        let grads = vec![None; shapes.len()];
        Trainer { c, rec, shapes, d, grads, optimizer_state: false, buckets: None }
    }

    fn block_param(&self, layer: u64, k: usize) -> usize {
        2 + layer as usize * BLOCK_PARAMS + k
    }

    /// AccumulateGrad: the first gradient becomes `.grad`; later ones are added in place and freed.
    fn grad(&mut self, param: usize, g: Tensor) {
        match self.grads[param] {
            None => self.grads[param] = Some(g),
            Some(_) => self.rec.free(g),
        }
        let bytes = self.shapes[param] * self.d;
        if let Some(b) = &mut self.buckets {
            if !b.ready[param] {
                b.ready[param] = true;
                b.filled += bytes;
                if b.filled >= BUCKET_BYTES {
                    let bucket = self.rec.alloc_on(b.filled, b.next_stream);
                    b.pending.push(bucket);
                    b.filled = 0;
                    b.next_stream = b.next_stream % (self.c.streams - 1) + 1;
                }
            }
        }
    }

    /// A Linear layer's backward for its parameters: grad_weight (out·in) then grad_bias (out).
    fn linear_param_grads(&mut self, layer: u64, (w, b): (usize, usize), dims: (u64, u64, u64)) {
        let (rows, out, inp) = dims;
        self.rec.compute(2 * rows * out * inp);
        let gw = self.rec.alloc(out * inp * self.d);
        self.grad(self.block_param(layer, w), gw);
        let gb = self.rec.alloc(out * self.d);
        self.grad(self.block_param(layer, b), gb);
    }

    /// Frees `t` unless autograd keeps it for backward.
    fn done(&mut self, t: Tensor, keep: bool) {
        if !keep {
            self.rec.free(t);
        }
    }

    /// One block's forward on its input (b·t·h, kept by the caller: it is saved by `ln_1`, or by
    /// the checkpoint); returns what it saved and its output. With `keep` false (checkpointed
    /// forward) the saved tensors are already freed on return.
    fn block_forward(&mut self, t: u64, keep: bool) -> (Saved, Tensor) {
        let (b, h, a, d) = (self.c.batch, self.c.hidden, self.c.heads, self.d);
        let bt = b * t;
        let scores = b * a * t * t;
        let r = &mut *self.rec;
        let ln1_out = r.alloc(bt * h * d);
        let ln1_mean = r.alloc(bt * 4);
        let ln1_rstd = r.alloc(bt * 4);
        self.done(ln1_mean, keep);
        self.done(ln1_rstd, keep);
        self.rec.compute(2 * bt * h * 3 * h);
        let qkv = self.rec.alloc(bt * 3 * h * d);
        self.done(ln1_out, keep);
        let r = &mut *self.rec;
        r.compute(2 * bt * t * h);
        let raw = r.alloc(scores * d);
        let scaled = r.alloc(scores * d);
        r.free(raw);
        let masked = r.alloc(scores * d);
        r.free(scaled);
        let softmax = r.alloc(scores * d);
        r.free(masked);
        let att_mask = r.alloc(scores);
        let att = r.alloc(scores * d);
        self.done(softmax, keep);
        self.done(att_mask, keep);
        let r = &mut *self.rec;
        r.compute(2 * bt * t * h);
        let att_v = r.alloc(bt * h * d);
        let y = r.alloc(bt * h * d);
        r.free(att_v);
        self.done(att, keep);
        self.done(qkv, keep);
        self.rec.compute(2 * bt * h * h);
        let proj = self.rec.alloc(bt * h * d);
        self.done(y, keep);
        let r = &mut *self.rec;
        let attn_drop_mask = r.alloc(bt * h);
        let attn_drop = r.alloc(bt * h * d);
        r.free(proj);
        self.done(attn_drop_mask, keep);
        let r = &mut *self.rec;
        let x_mid = r.alloc(bt * h * d);
        r.free(attn_drop);
        let ln2_out = r.alloc(bt * h * d);
        let ln2_mean = r.alloc(bt * 4);
        let ln2_rstd = r.alloc(bt * 4);
        self.done(ln2_mean, keep);
        self.done(ln2_rstd, keep);
        self.rec.compute(2 * bt * h * 4 * h);
        let fc = self.rec.alloc(bt * 4 * h * d);
        self.done(ln2_out, keep);
        let gelu = self.rec.alloc(bt * 4 * h * d);
        self.done(fc, keep);
        self.rec.compute(2 * bt * 4 * h * h);
        let mlp_proj = self.rec.alloc(bt * h * d);
        self.done(gelu, keep);
        let r = &mut *self.rec;
        let mlp_drop_mask = r.alloc(bt * h);
        let mlp_drop = r.alloc(bt * h * d);
        r.free(mlp_proj);
        self.done(mlp_drop_mask, keep);
        let out = self.rec.alloc(bt * h * d);
        self.rec.free(mlp_drop);
        self.done(x_mid, keep);
        let saved = Saved {
            ln1_out,
            ln1_mean,
            ln1_rstd,
            qkv,
            softmax,
            att_mask,
            att,
            y,
            attn_drop_mask,
            x_mid,
            ln2_out,
            ln2_mean,
            ln2_rstd,
            fc,
            gelu,
            mlp_drop_mask,
        };
        (saved, out)
    }

    /// Block `layer`'s backward: `g` is the gradient of its output, `x` its input; both are
    /// freed, with everything in `s`. Returns the gradient of `x`.
    fn block_backward(&mut self, layer: u64, t: u64, x: Tensor, s: Saved, g: Tensor) -> Tensor {
        let (b, h, a, d) = (self.c.batch, self.c.hidden, self.c.heads, self.d);
        let bt = b * t;
        let scores = b * a * t * t;
        // MLP branch (the residual add passes `g` to both branches unchanged).
        let g_drop = self.rec.alloc(bt * h * d);
        self.rec.free(s.mlp_drop_mask);
        self.rec.compute(2 * bt * h * 4 * h);
        let g_gelu = self.rec.alloc(bt * 4 * h * d);
        self.linear_param_grads(layer, (MLP_PROJ_W, MLP_PROJ_B), (bt, h, 4 * h));
        self.rec.free(s.gelu);
        self.rec.free(g_drop);
        let g_fc = self.rec.alloc(bt * 4 * h * d);
        self.rec.free(s.fc);
        self.rec.free(g_gelu);
        self.rec.compute(2 * bt * 4 * h * h);
        let g_ln2 = self.rec.alloc(bt * h * d);
        self.linear_param_grads(layer, (FC_W, FC_B), (bt, 4 * h, h));
        self.rec.free(s.ln2_out);
        self.rec.free(g_fc);
        let ln2 = [s.ln2_mean, s.ln2_rstd, s.x_mid];
        let g_mid = self.layer_norm_backward(layer, (LN2_W, LN2_B), bt, ln2, g_ln2);
        let r = &mut *self.rec;
        r.free(g);
        // Attention branch.
        let g_drop = r.alloc(bt * h * d);
        r.free(s.attn_drop_mask);
        r.compute(2 * bt * h * h);
        let g_y = r.alloc(bt * h * d);
        self.linear_param_grads(layer, (ATTN_PROJ_W, ATTN_PROJ_B), (bt, h, h));
        let r = &mut *self.rec;
        r.free(s.y);
        r.free(g_drop);
        let g_att_v = r.alloc(bt * h * d);
        r.free(g_y);
        r.compute(4 * bt * t * h);
        let g_att = r.alloc(scores * d);
        let g_v = r.alloc(bt * h * d);
        r.free(s.att);
        r.free(g_att_v);
        let g_dropped = r.alloc(scores * d);
        r.free(s.att_mask);
        r.free(g_att);
        let g_softmax = r.alloc(scores * d);
        r.free(s.softmax);
        r.free(g_dropped);
        let g_masked = r.alloc(scores * d);
        r.free(g_softmax);
        let g_scaled = r.alloc(scores * d);
        r.free(g_masked);
        r.compute(4 * bt * t * h);
        let g_q = r.alloc(bt * h * d);
        let g_k = r.alloc(bt * h * d);
        r.free(g_scaled);
        let g_qkv = r.alloc(bt * 3 * h * d);
        r.free(g_q);
        r.free(g_k);
        r.free(g_v);
        r.free(s.qkv);
        r.compute(2 * bt * 3 * h * h);
        let g_ln1 = r.alloc(bt * h * d);
        self.linear_param_grads(layer, (ATTN_W, ATTN_B), (bt, 3 * h, h));
        self.rec.free(s.ln1_out);
        self.rec.free(g_qkv);
        let g_x =
            self.layer_norm_backward(layer, (LN1_W, LN1_B), bt, [s.ln1_mean, s.ln1_rstd, x], g_ln1);
        self.rec.free(g_mid);
        g_x
    }

    /// A LayerNorm's backward over `rows` rows, once the gradient of its output (`g_out`) is
    /// complete: grad of its normalised input, grad_weight and grad_bias, then frees what the
    /// forward saved (`saved`: mean, rstd and the input) and `g_out`, and returns the gradient
    /// of its input.
    fn layer_norm_backward(
        &mut self,
        layer: u64,
        (w, b): (usize, usize),
        rows: u64,
        saved: [Tensor; 3],
        g_out: Tensor,
    ) -> Tensor {
        let (h, d) = (self.c.hidden, self.d);
        let g_normed = self.rec.alloc(rows * h * d);
        let (pw, pb) = (self.block_param(layer, w), self.block_param(layer, b));
        let gw = self.rec.alloc(h * d);
        self.grad(pw, gw);
        let gb = self.rec.alloc(h * d);
        self.grad(pb, gb);
        let r = &mut *self.rec;
        for t in saved {
            r.free(t);
        }
        r.free(g_out);
        let g_in = r.alloc(rows * h * d);
        r.free(g_normed);
        g_in
    }

    /// One micro-batch of `t` tokens per sequence: forward, loss and backward.
    fn micro_batch(&mut self, t: u64, sync: bool) {
        let c = self.c;
        let (b, h, v, d) = (c.batch, c.hidden, c.vocab, self.d);
        let bt = b * t;
        if sync {
            self.buckets = Some(Buckets {
                filled: 0,
                ready: vec![false; self.shapes.len()],
                pending: Vec::new(),
                next_stream: 1,
            });
        }
        let r = &mut *self.rec;
        let ids = r.alloc(bt * 8);
        let targets = r.alloc(bt * 8);
        // Embeddings: wte(idx) + wpe(pos), then dropout.
        let tok = r.alloc(bt * h * d);
        let pos = r.alloc(t * h * d);
        let x0 = r.alloc(bt * h * d);
        r.free(tok);
        r.free(pos);
        let emb_mask = r.alloc(bt * h);
        let mut x = r.alloc(bt * h * d);
        r.free(x0);
        // Blocks: `inputs[l]` is block l's input, `inputs[layers]` the final LayerNorm's.
        let mut inputs = vec![x];
        let mut saved = Vec::new();
        for _ in 0..c.layers {
            if self.rec.halted() {
                return;
            }
            let (s, out) = self.block_forward(t, !c.checkpointing);
            if !c.checkpointing {
                saved.push(s);
            }
            inputs.push(out);
            x = out;
        }
        // Final LayerNorm, LM head (tied to wte) and cross-entropy.
        let r = &mut *self.rec;
        let lnf_out = r.alloc(bt * h * d);
        let lnf_mean = r.alloc(bt * 4);
        let lnf_rstd = r.alloc(bt * 4);
        r.compute(2 * bt * h * v);
        let logits = r.alloc(bt * v * d);
        // Under autocast, cross_entropy runs in fp32: a cast copy feeds log_softmax.
        let logits32 = c.mixed_precision.then(|| r.alloc(bt * v * 4));
        let logp = r.alloc(bt * v * 4);
        if let Some(l32) = logits32 {
            r.free(l32);
        }
        let loss = r.alloc(4);
        let total_weight = r.alloc(4);

        // loss.backward()
        let g_loss = r.alloc(4);
        let g_logp = r.alloc(bt * v * 4);
        r.free(g_loss);
        r.free(total_weight);
        let g_logits32 = r.alloc(bt * v * 4);
        r.free(logp);
        r.free(g_logp);
        let g_logits = if c.mixed_precision {
            let g = r.alloc(bt * v * d);
            r.free(g_logits32);
            g
        } else {
            g_logits32
        };
        r.compute(2 * bt * h * v);
        let g_lnf = r.alloc(bt * h * d);
        r.compute(2 * bt * h * v);
        let g_wte = r.alloc(v * h * d);
        self.grad(WTE, g_wte);
        let r = &mut *self.rec;
        r.free(g_logits);
        r.free(lnf_out);
        let mut g = r.alloc(bt * h * d);
        let lnf = self.shapes.len() - 2;
        let gw = self.rec.alloc(h * d);
        self.grad(lnf, gw);
        let gb = self.rec.alloc(h * d);
        self.grad(lnf + 1, gb);
        let r = &mut *self.rec;
        r.free(lnf_mean);
        r.free(lnf_rstd);
        r.free(x);
        r.free(g_lnf);
        for layer in (0..c.layers).rev() {
            if self.rec.halted() {
                return;
            }
            let input = inputs[layer as usize];
            let s = match saved.pop() {
                Some(s) => s,
                None => {
                    // Checkpointed: recompute the block's forward, keeping what it saves.
                    let (s, out) = self.block_forward(t, true);
                    self.rec.free(out);
                    s
                }
            };
            g = self.block_backward(layer, t, input, s, g);
        }
        // Embedding dropout, then the position (summed over the batch) and token embeddings.
        let r = &mut *self.rec;
        let g0 = r.alloc(bt * h * d);
        r.free(emb_mask);
        r.free(g);
        let g_pos = r.alloc(t * h * d);
        let g_wpe = r.alloc(c.seq * h * d);
        self.grad(WPE, g_wpe);
        self.rec.free(g_pos);
        let g_wte = self.rec.alloc(v * h * d);
        self.grad(WTE, g_wte);
        let r = &mut *self.rec;
        r.free(g0);
        // The training loop drops its references to the batch, logits and loss.
        r.free(logits);
        r.free(loss);
        r.free(ids);
        r.free(targets);
        if let Some(mut buckets) = self.buckets.take() {
            if buckets.filled > 0 {
                let bucket = self.rec.alloc_on(buckets.filled, buckets.next_stream);
                buckets.pending.push(bucket);
            }
            for bucket in buckets.pending {
                self.rec.free(bucket);
            }
        }
    }

    /// `optimizer.step()` (AdamW, foreach) then `optimizer.zero_grad(set_to_none=True)`.
    fn optimizer_step(&mut self) {
        let r = &mut *self.rec;
        if !self.optimizer_state {
            // _init_group: exp_avg then exp_avg_sq per parameter, fp32 (master) like the weights.
            for &n in &self.shapes {
                r.alloc(n * 4);
                r.alloc(n * 4);
            }
            self.optimizer_state = true;
        }
        // Mixed precision: the 2-byte gradients are upcast for the fp32 master update.
        let upcast: Vec<Tensor> = if self.c.mixed_precision {
            self.shapes.iter().map(|&n| r.alloc(n * 4)).collect()
        } else {
            Vec::new()
        };
        // _foreach_sqrt(exp_avg_sqs): one temporary per parameter, all live together.
        let sqrt: Vec<Tensor> = self.shapes.iter().map(|&n| r.alloc(n * 4)).collect();
        for t in sqrt.into_iter().chain(upcast) {
            r.free(t);
        }
        for g in self.grads.iter_mut() {
            if let Some(g) = g.take() {
                r.free(g);
            }
        }
    }
}
