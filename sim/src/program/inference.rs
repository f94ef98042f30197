//! Inference in the step program: the KV cache for the whole context (or AutoAWQ's fused
//! modules, which make their own), prefill unit by unit and the logits of the last prompt token
//! (`Builder::inference`).

use super::{AllocId, Builder, Component, Event};
use crate::model::units::{Unit, UnitKind};
use vramplan_profiles::model::{AttentionKind, StackKind};

impl Builder<'_, '_> {
    /// Per unit, the KV cache its block holds for the whole context (0 for other units).
    fn kv_cache_bytes(&self) -> Vec<u64> {
        let w = self.workload;
        let kv_dtype = w.kv_dtype.unwrap_or(self.r.precision.compute);
        let f = &self.r.model.facts;
        if f.model_type == "xlnet" {
            // XLNet keeps each layer's input as its `mems` (`model/xlnet.rs`), not keys and values.
            let mems = crate::model::xlnet::mems_per_token(self.r.model, &self.r.precision);
            let per_layer = mems.saturating_mul(w.seq).saturating_mul(w.batch);
            let block = |u: &Unit| matches!(u.kind, UnitKind::Block(_));
            return self.r.units.iter().map(|u| if block(u) { per_layer } else { 0 }).collect();
        }
        let per_token_layer = match &f.attention {
            AttentionKind::MultiLatent { qk_nope_head_dim, qk_rope_head_dim, v_head_dim, .. } => {
                // transformers caches the decompressed keys and values of every head.
                f.num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)
            }
            AttentionKind::Standard => 2 * f.num_kv_heads * f.head_dim,
        };
        self.r
            .units
            .iter()
            .map(|u| match u.kind {
                // Encoder blocks (BERT, T5's encoder) attend once and cache nothing.
                UnitKind::Block(layer)
                    if f.layers.get(layer).is_some_and(|l| l.stack == StackKind::Decoder) =>
                {
                    // A windowed (sliding or chunked) layer caches its last `window` tokens; but
                    // after a prompt longer than that, transformers' `DynamicSlidingWindowLayer`
                    // keeps them as a view of the prompt's concatenated keys and values
                    // (`full_key_states[:, :, -self.sliding_window + 1 :, :]`, cache_utils.py),
                    // which holds the whole prompt's storage until the next token replaces it.
                    let window = f.layers.get(layer).and_then(|l| l.attention_window).unwrap_or(u64::MAX);
                    let held = w.seq.min(window.max(self.prompt()));
                    let kv = kv_dtype.bytes_for(per_token_layer * held * w.batch);
                    // A state-space mixer's fixed state per sequence (`model/ssm.rs`).
                    let ssm = f.layers[layer].ssm.as_ref().map_or(0, |ssm| {
                        crate::model::ssm::state_bytes(ssm, w.batch, self.r.precision.compute_bytes())
                    });
                    kv + ssm
                }
                _ => 0,
            })
            .collect()
    }

    /// AutoAWQ's `LlamaFuser.fuse_transformer`, layer by layer (`model/awq_fused.rs`): the fused
    /// qkv's zero-filled buffers each replaced by the `torch.cat` of q's, k's and v's, the
    /// `WindowedCache` (V, then K: fp32 on the GPU, then its fp16 copy) and the rotary table;
    /// the unfused q, k and v are freed with the unfused model after the last layer.
    fn awq_fuse(&mut self, max_seq_len: u64) {
        let f = &self.r.model.facts;
        let (batch, kv_heads, head_dim) = (self.workload.batch, f.num_kv_heads, f.head_dim);
        let cache = crate::model::awq_fused::cache_tensor_bytes(batch, max_seq_len, kv_heads, head_dim);
        let rope = crate::model::awq_fused::rope_bytes(max_seq_len, head_dim);
        self.compute(None, None, Event::Load);
        let mut unfused: Vec<Option<AllocId>> = Vec::new();
        for i in 0..self.r.units.len() {
            let (UnitKind::Block(_), Some(device)) = (self.r.units[i].kind, self.r.devices[i]) else {
                continue;
            };
            let unit = Some(i);
            // The fused tensors: each the bytes of q's, k's and v's (a quantized `weight` holds
            // AWQ's qweight, qzeros and scales together).
            let fused: Vec<u64> = ["weight", "bias"]
                .iter()
                .map(|suffix| {
                    let u = &self.r.units[i];
                    u.placed_by
                        .iter()
                        .zip(&u.weight_tensors)
                        .filter(|(name, _)| {
                            ["q_proj", "k_proj", "v_proj"]
                                .iter()
                                .any(|p| name.ends_with(&format!(".self_attn.{p}.{suffix}")))
                        })
                        .map(|(_, b)| *b)
                        .sum()
                })
                .collect();
            let zeros: Vec<Option<AllocId>> =
                fused.iter().map(|&b| self.alloc(device, unit, Component::Weights, b)).collect();
            for (&bytes, zero) in fused.iter().zip(zeros) {
                // The cat replaces the zero-filled buffer. It has the bytes of the load's q, k
                // and v, which stand for it from here on: the cat stands for the unfused copies
                // the fuse frees at its end.
                unfused.push(self.alloc(device, unit, Component::Weights, bytes));
                self.free(zero);
            }
            // 0.1.6's `WindowedCache` is `torch.zeros(..).to(device).half()`: fp32 on the GPU
            // first. From 0.2.7.post3 (`--attn flash`) it is made in fp16 directly
            // (`torch.zeros(size, device=device, dtype=torch.float16)`, awq/modules/fused/cache.py).
            let made_in_fp32 = crate::model::awq_fused::attention(self.workload)
                != Some(crate::workload::AttentionImpl::Flash);
            for _ in 0..2 {
                let fp32 = made_in_fp32.then(|| self.alloc(device, unit, Component::KvCache, 2 * cache));
                self.alloc(device, unit, Component::KvCache, cache);
                self.free(fp32.flatten());
            }
            self.alloc(device, unit, Component::Weights, rope);
        }
        unfused.into_iter().for_each(|id| self.free(id));
    }

    /// The KV cache for the whole context, on the GPU of each unit that keeps one.
    fn alloc_kv_cache(&mut self) {
        for (i, bytes) in self.kv_cache_bytes().into_iter().enumerate() {
            if let Some(device) = self.r.devices[i] {
                self.alloc(device, Some(i), Component::KvCache, bytes);
            }
        }
    }

    /// Inference: the KV cache for the whole context, then prefill one unit at a time.
    pub(super) fn inference(&mut self) {
        let w = self.workload;
        let prompt = self.prompt();
        let pixel_values = self.pixel_values();
        // transformers' cache starts empty and grows as each language layer runs; a vision
        // tower runs before any of them, so a vision-language model's cache is made after it
        // (docs/memory-model.md, "Vision-language models"). Others make it up front.
        let model = self.r.model;
        let mut kv_pending = model.facts.vision.is_some();
        if let Some(max_seq_len) = w.awq_fused {
            // AutoAWQ's fuse makes its own cache at load, for the batch (`model/awq_fused.rs`).
            self.awq_fuse(max_seq_len);
        } else if !kv_pending {
            self.alloc_kv_cache();
        }
        let vocab = self.r.model.facts.vocab_size;
        let c = self.r.precision.compute_bytes();
        let follows = self.r.blocks.runs_transformers_forward();
        // What the model's own forward holds across its layers, made at the embedding.
        let mut model_held: Vec<Option<AllocId>> = Vec::new();
        // The GPU of the input embeddings, while they are the hidden states the loop names.
        let mut embeddings_on: Option<u32> = None;
        let mut autocast_cache: Vec<Option<AllocId>> = Vec::new();
        for i in 0..self.r.units.len() {
            let Some(device) = self.r.devices[i] else { continue };
            let kind = self.r.units[i].kind;
            let unit = Some(i);
            let event = if kind == UnitKind::Head { Event::LastLogits } else { Event::Prefill(i) };
            let language = match kind {
                UnitKind::Block(layer) => model.facts.layers[layer].stack != StackKind::Vision,
                _ => kind == UnitKind::Head,
            };
            if kv_pending && language {
                kv_pending = false;
                self.alloc_kv_cache();
            }
            if kind == UnitKind::Head {
                // The inner model's forward has returned: its locals are freed.
                std::mem::take(&mut model_held).into_iter().for_each(|id| self.free(id));
            }
            self.compute(unit, Some(device), event);
            // Autocast's cache keeps each weight's half copy (a leaf that requires grad, even
            // under no_grad) until the autocast region ends, after the forward
            // (`at::autocast::cached_cast`, cleared on leaving the outermost region).
            let autocast_copies = c * self.r.units[i].autocast_params;
            autocast_cache.push(self.alloc(device, unit, Component::Weights, autocast_copies));
            if kind == UnitKind::Embedding && follows && model_held.is_empty() {
                let held = self.r.blocks.prefill_held(w.batch, prompt);
                model_held =
                    held.into_iter().map(|b| self.alloc(device, unit, Component::Activations, b)).collect();
                embeddings_on = Some(device);
            }
            // A layer's input is the hidden states the model's loop hands it: the previous
            // layer's output, or accelerate's copy of it on this GPU; the first layer's, the
            // input embeddings held above when on their GPU. Charged to the layer it feeds,
            // live while it runs: the previous layer's output outlives that layer only while
            // nothing else runs.
            let acts = match kind {
                UnitKind::Block(layer) => Some(self.r.blocks.block(layer, w.batch, prompt)),
                _ => None,
            };
            let first_block_with_embeddings = acts.is_some() && embeddings_on.take() == Some(device);
            let input = match &acts {
                Some(acts) if follows && !first_block_with_embeddings => {
                    self.alloc(device, unit, Component::Activations, acts.input)
                }
                _ => None,
            };
            // accelerate's pre-forward hook loads a unit's offloaded weights to the main GPU.
            let r = self.r;
            let main = r.main_gpu.unwrap_or(device);
            let copies: Vec<Option<AllocId>> = r.streamed[i]
                .iter()
                .map(|&j| {
                    let bytes = self.held_tensor_bytes(r.units[i].weight_tensors[j]);
                    self.alloc(main, unit, Component::Weights, bytes)
                })
                .collect();
            match kind {
                UnitKind::Block(_) => {
                    let working_set = acts.map(|a| a.working_set).unwrap_or_default();
                    self.transient_activations(device, unit, &working_set, self.dequant_transient(i));
                }
                UnitKind::Head => {
                    let half = self.alloc(device, unit, Component::Logits, c * vocab * w.batch);
                    let upcast = self.alloc(device, unit, Component::Logits, 4 * vocab * w.batch);
                    self.free(upcast);
                    self.free(half);
                }
                UnitKind::Embedding | UnitKind::Other => {}
            }
            // The post-forward hook drops the streamed weights; the loop's reassignment frees
            // the input.
            copies.into_iter().for_each(|id| self.free(id));
            self.free(input);
        }
        autocast_cache.into_iter().for_each(|id| self.free(id));
        self.free(pixel_values);
    }
}
