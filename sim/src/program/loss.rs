//! The loss over vocabulary logits, on the head's device, as each trainer's program computes
//! it: transformers' `ForCausalLMLoss` (and torchtune's plain cross-entropy, both on fp32
//! logits), torchtune's chunked loss eager or compiled, LitGPT's 128-token chunks, Unsloth's
//! fused linear cross-entropy. A task head's loss is `model/head.rs`'s.

use super::{AllocId, Builder, Component, Event};
use crate::workload::{Finetune, Trainer};

impl Builder<'_, '_> {
    /// The loss of step `step` on the head `h` (on `device`): what it allocates, and in
    /// `logits_ids` what stays live into the head's backward.
    pub(super) fn vocabulary_loss(
        &mut self,
        h: usize,
        device: u32,
        step: u8,
        logits_ids: &mut Vec<Option<AllocId>>,
    ) {
        let w = self.workload;
        let tokens = w.batch * w.seq;
        let vocab = self.r.model.facts.vocab_size;
        let c = self.r.precision.compute_bytes();
        let unit = Some(h);
        self.compute(unit, Some(device), Event::Loss(step));
        if w.trainer == Trainer::Unsloth {
            // Unsloth's fused linear cross-entropy (unsloth_zoo 2026.10,
            // `fused_linear_cross_entropy`): the gradient with respect to the hidden states
            // is taken in the forward into `grad_h` (kept for the head's backward), chunk by
            // chunk through one logits buffer (`model/unsloth.rs`); no logits outlive it.
            let gpu = self.r.hardware.devices.get(device as usize);
            let loss_device = crate::model::unsloth::LossDevice {
                major: gpu.map(|d| d.compute_capability.major).unwrap_or(8),
                total_memory: gpu.map(|d| d.memory_bytes).unwrap_or(u64::MAX),
            };
            let hidden = self.r.model.facts.hidden_size;
            let compute = self.r.precision.compute;
            let chunk_bytes =
                crate::model::unsloth::fused_ce_transient(tokens, hidden, vocab, compute, &loss_device);
            let grad_inputs = self.handoff_bytes(w.seq);
            logits_ids.push(self.alloc(device, unit, Component::Activations, grad_inputs));
            let chunk = self.alloc(device, unit, Component::Logits, chunk_bytes);
            self.free(chunk);
            self.compute(unit, Some(device), Event::LossBackward(step));
            // Backward returns `grad_inputs` times the loss's scale, out of place.
            logits_ids.push(self.alloc(device, unit, Component::Activations, grad_inputs));
        } else if w.switches.chunked_cross_entropy && !w.switches.compile {
            // torchtune's `CEWithChunkedOutputLoss` run eagerly: the output projection makes
            // 8 chunks of model-dtype logits (`chunked_output`), then each chunk's
            // `F.cross_entropy(chunk.float())` keeps its fp32 log-softmax for backward, the
            // fp32 copy freed as the chunk's loss returns; the recipe's `del logits` frees
            // the model-dtype chunks. Backward, chunk by chunk: the NLL gradient and the
            // log-softmax gradient (fp32), the log-softmax freed, the model-dtype gradient.
            let chunk = vocab * tokens / 8;
            let logits = self.alloc(device, unit, Component::Logits, c * vocab * tokens);
            let mut log_softmax = Vec::with_capacity(8);
            for _ in 0..8 {
                let upcast = self.alloc(device, unit, Component::Logits, 4 * chunk);
                log_softmax.push(self.alloc(device, unit, Component::Logits, 4 * chunk));
                self.free(upcast);
            }
            self.free(logits);
            self.compute(unit, Some(device), Event::LossBackward(step));
            for kept in log_softmax {
                let nll_grad = self.alloc(device, unit, Component::Logits, 4 * chunk);
                let grad = self.alloc(device, unit, Component::Logits, 4 * chunk);
                self.free(nll_grad);
                self.free(kept);
                let cast = self.alloc(device, unit, Component::Logits, c * chunk);
                self.free(grad);
                self.free(cast);
            }
        } else if crate::model::litgpt::runs(w) {
            // LitGPT's loss (`model/litgpt.rs`): the logits, all chunks, held by the loop
            // through backward beside each chunk's log-softmax.
            let full = matches!(w.finetune, Finetune::Full);
            let loss = crate::model::litgpt::loss_bytes(full, w.batch, w.seq, vocab, c);
            let logits = self.alloc(device, unit, Component::Logits, loss.logits);
            // The assignment drops the last step's logits.
            let last = self.litgpt_logits.take();
            self.free(last);
            let copy = self.alloc(device, unit, Component::Logits, loss.forward_copy);
            let log_softmax = self.alloc(device, unit, Component::Logits, loss.log_softmax);
            self.free(copy);
            self.compute(unit, Some(device), Event::LossBackward(step));
            let nll_grad = self.alloc(device, unit, Component::Logits, loss.chunk);
            let grad = self.alloc(device, unit, Component::Logits, loss.chunk);
            self.free(nll_grad);
            self.free(log_softmax);
            if loss.whole_gradient == 0 {
                // `lora.py`: each chunk's gradient goes to its own head chunk, whose
                // backward runs before the next chunk's loss backward: the first chunk's
                // gradient and the other chunks' log-softmax are live through it.
                let rest = loss.log_softmax.saturating_sub(loss.chunk);
                logits_ids.push(self.alloc(device, unit, Component::Logits, rest));
                logits_ids.push(grad);
            } else {
                self.free(grad);
            }
            if loss.whole_gradient > 0 {
                // The chunks' gradients, concatenated, then written into the logits' shape.
                let chunks = self.alloc(device, unit, Component::Logits, loss.whole_gradient);
                let cat = self.alloc(device, unit, Component::Logits, loss.whole_gradient);
                self.free(chunks);
                logits_ids.push(self.alloc(device, unit, Component::Logits, loss.logits));
                self.free(cat);
            }
            self.litgpt_logits = logits;
        } else if w.switches.chunked_cross_entropy {
            logits_ids.push(self.alloc(device, unit, Component::Logits, c * vocab * tokens));
            // Chunked cross-entropy compiled (`torch.compile` of `compute_cross_entropy`,
            // torchtune's `compile_loss`): the upcast is fused away; only the logits (and a
            // per-token log-sum-exp) stay for backward, and a chunk's backward makes only
            // its model-dtype gradient.
            let chunk = vocab * tokens / 8;
            self.compute(unit, Some(device), Event::LossBackward(step));
            let grad = self.alloc(device, unit, Component::Logits, c * chunk);
            self.free(grad);
        } else {
            // The loss takes log-softmax of the logits — upcast to fp32 first by
            // transformers' `ForCausalLMLoss` (`logits.float()`, freed when the loss
            // returns) and by torchtune's model (`.float()` of its output; the recipe deletes
            // it after the loss), in the model dtype by others — and keeps its output for backward;
            // backward makes the dense NLL gradient and the log-softmax gradient of the same
            // size, then the logits' gradient. Neither trainer keeps the logits themselves
            // into backward: the HF Trainer's `compute_loss` returns the loss alone and drops
            // the model's output, the torchtune recipe deletes it after the loss.
            logits_ids.push(self.alloc(device, unit, Component::Logits, c * vocab * tokens));
            // Gemma 2 soft-caps its logits (`final_logit_softcapping`): `tanh(logits / cap) ·
            // cap`, where the tanh keeps its output for backward (to the head's) and each
            // step makes a logits-sized tensor.
            let mut softcap_kept = None;
            if crate::model::activations::soft_caps_logits(self.r.model) {
                let transient = self.alloc(device, unit, Component::Logits, c * vocab * tokens);
                softcap_kept = self.alloc(device, unit, Component::Logits, c * vocab * tokens);
                self.free(transient);
            }
            let transformers = w.trainer.loss_on_fp32_logits();
            let upcast = if transformers {
                self.alloc(device, unit, Component::Logits, 4 * vocab * tokens)
            } else {
                None
            };
            let loss_bytes = if transformers { 4 } else { c } * vocab * tokens;
            let log_softmax = self.alloc(device, unit, Component::Logits, loss_bytes);
            self.free(upcast);
            logits_ids.drain(..).for_each(|id| self.free(id));
            logits_ids.push(softcap_kept);
            self.compute(unit, Some(device), Event::LossBackward(step));
            let nll_grad = self.alloc(device, unit, Component::Logits, loss_bytes);
            let grad = self.alloc(device, unit, Component::Logits, loss_bytes);
            self.free(nll_grad);
            self.free(log_softmax);
            logits_ids.push(self.alloc(device, unit, Component::Logits, c * vocab * tokens));
            self.free(grad);
        }
    }
}
