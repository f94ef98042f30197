//! One unit's operations, module by module (see `plan.rs` for what each module kind runs):
//! [`Walk::unit_forward`] writes the forward (or the recompute, or a prefill), and
//! [`Walk::backward`] the backward of each forward operation, in reverse. Pure: no CUDA.

use super::ops::{Gemm, GemmKind, GemmRole, Operand, Operation, Param, Pass, Source, Work};
use super::plan::{Planner, THETA};
use vramplan_profiles::model::{AttentionKind, Module, ModuleKind, NormKind, StackKind, join};
use vramplan_sim::program::UnitRole;
use vramplan_sim::workload::{AttentionImpl, Mode};

/// Writes one unit's operations.
pub(super) struct Walk<'p, 'a> {
    pub p: &'p Planner<'a>,
    pub unit: usize,
    pub device: u32,
    pub pass: Pass,
    pub batch: u64,
    pub seq: u64,
    pub ops: Vec<Operation>,
}

impl Walk<'_, '_> {
    fn e(&self) -> u64 {
        self.p.compute.bytes()
    }

    fn push(
        &mut self,
        module: &str,
        name: &'static str,
        dims: Vec<u64>,
        split: Vec<usize>,
        operands: Vec<Operand>,
        params: Vec<Param>,
    ) {
        let op = self.p.kernel(
            module,
            self.device,
            self.pass,
            self.p.compute,
            name,
            dims,
            split,
            operands,
            params,
        );
        self.ops.push(op);
    }

    fn scratch(&self, dims: &[usize]) -> Operand {
        Operand::new(Source::Scratch, self.e(), dims)
    }

    fn tensor(&self, path: &str, dims: &[usize]) -> Operand {
        Operand::new(Source::Tensor(self.p.resolve(path)), self.e(), dims)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        module: &str,
        kind: GemmKind,
        role: GemmRole,
        trans: (bool, bool),
        dims: [u64; 4],
        abc: [Source; 3],
        b_batched: bool,
    ) {
        let gemm = Gemm { kind, role, trans_a: trans.0, trans_b: trans.1 };
        self.ops.push(Operation::gemm(
            module,
            self.device,
            self.pass,
            self.p.compute,
            gemm,
            dims,
            abc,
            b_batched,
        ));
    }

    /// The unit's modules: its own, or those its keys name (an alias tied to it, T5's
    /// `encoder.embed_tokens`); a parent's own tensors run nothing on a plain step.
    pub(super) fn unit_forward(&mut self, tokens: u64) {
        let unit = &self.p.units[self.unit];
        if unit.keys.first() != Some(&unit.path) {
            return;
        }
        for key in &unit.keys {
            if let Some(m) = self.p.model.root.find(key) {
                self.module(m, tokens, false);
            }
        }
    }

    fn module(&mut self, m: &Module, rows: u64, in_attention: bool) {
        let f = &self.p.model.facts;
        match m.kind {
            ModuleKind::Embedding => {
                let Some(w) = m.tensors.iter().find(|t| t.name == "weight" && t.shape.len() == 2) else {
                    return;
                };
                let in_block = !matches!(self.p.units[self.unit].role, UnitRole::Embedding | UnitRole::Other);
                let rows = if in_block { self.seq * self.seq } else { rows };
                let dims = vec![rows, w.shape[0], w.shape[1]];
                let operands = vec![
                    Operand::new(Source::Scratch, 4, &[0]),
                    self.tensor(&join(&m.path, "weight"), &[1, 2]),
                    self.scratch(&[0, 2]),
                ];
                self.push(&m.path, "vp_embedding", dims, vec![0, 1, 2], operands, vec![]);
            }
            ModuleKind::Norm => {
                let Some(w) = m.tensors.iter().find(|t| t.name == "weight") else { return };
                let width = w.numel();
                let rows = if width == f.head_dim && width != f.hidden_size {
                    rows * f.num_attention_heads
                } else {
                    rows
                };
                let weight = self.tensor(&join(&m.path, "weight"), &[1]);
                if f.norm == NormKind::RmsNorm || m.class.contains("RMS") {
                    let operands = vec![self.scratch(&[0, 1]), weight, self.scratch(&[0, 1])];
                    self.push(
                        &m.path,
                        "vp_rms_norm",
                        vec![rows, width],
                        vec![0],
                        operands,
                        vec![Param::F32(1e-6)],
                    );
                } else {
                    let has_bias = m.tensors.iter().any(|t| t.name == "bias");
                    let bias = self.tensor(&join(&m.path, if has_bias { "bias" } else { "weight" }), &[1]);
                    let operands = vec![self.scratch(&[0, 1]), weight, bias, self.scratch(&[0, 1])];
                    let params = vec![Param::F32(1e-5), Param::I32(i32::from(has_bias))];
                    self.push(&m.path, "vp_layer_norm", vec![rows, width], vec![0], operands, params);
                }
            }
            ModuleKind::Linear => self.linear(m, rows),
            ModuleKind::Router => {
                self.linear(m, rows);
                if let (Some(moe), Some(w)) = (&f.moe, m.tensors.iter().find(|t| t.name == "weight")) {
                    let experts = w.shape.first().copied().unwrap_or(u64::from(moe.experts));
                    let operands = vec![
                        self.scratch(&[0, 1]),
                        Operand::new(Source::Scratch, 4, &[0, 2]),
                        self.scratch(&[0, 2]),
                    ];
                    self.push(
                        &m.path,
                        "vp_moe_topk",
                        vec![rows, experts, u64::from(moe.top_k).min(experts)],
                        vec![0],
                        operands,
                        vec![],
                    );
                }
            }
            ModuleKind::Experts { count } => {
                let routed = f
                    .moe
                    .as_ref()
                    .map_or(rows, |moe| (rows * u64::from(moe.top_k)).div_ceil(u64::from(count.max(1))));
                self.experts(m, routed, u64::from(count));
                m.children.iter().for_each(|c| self.module(c, routed, in_attention));
            }
            ModuleKind::Block | ModuleKind::Container | ModuleKind::Other => {
                let attention = !in_attention
                    && m.kind != ModuleKind::Block
                    && m.name().to_ascii_lowercase().contains("att");
                m.children.iter().for_each(|c| self.module(c, rows, in_attention || attention));
                if attention {
                    self.attention(m, rows);
                }
            }
        }
    }

    /// `(out, in, weight path, stored [in × out])` of a linear layer, from its float weight or
    /// the float form of its quantized one.
    fn linear_dims(&self, m: &Module) -> Option<(u64, u64, String, bool)> {
        let conv1d = m.class == "Conv1D";
        if let Some(w) =
            m.tensors.iter().find(|t| t.name == "weight" && t.shape.len() == 2 && t.dtype.is_float())
        {
            let (o, i) = if conv1d { (w.shape[1], w.shape[0]) } else { (w.shape[0], w.shape[1]) };
            return Some((o, i, join(&m.path, "weight"), conv1d));
        }
        m.tensors.iter().find_map(|t| {
            let path = join(&m.path, &t.name);
            let form =
                self.p.model.float_forms.get(&path).filter(|f| f.name == "weight" && f.shape.len() == 2)?;
            Some((form.shape[0], form.shape[1], path, false))
        })
    }

    fn linear(&mut self, m: &Module, rows: u64) {
        let Some((out, inp, weight, conv1d)) = self.linear_dims(m) else { return };
        let f = &self.p.model.facts;
        let widths = [
            f.intermediate_size,
            f.moe.as_ref().map_or(0, |x| x.expert_intermediate_size),
            f.moe.as_ref().map_or(0, |x| x.shared_intermediate_size),
        ];
        if out == f.hidden_size && widths.contains(&inp) && inp != f.hidden_size {
            self.activation(&m.path, rows, inp);
        }
        let kind = if m.kind == ModuleKind::Router { GemmKind::Router } else { GemmKind::Linear };
        let w = Source::Tensor(self.p.resolve(&weight));
        self.gemm(
            &m.path,
            kind,
            GemmRole::Forward,
            (false, !conv1d),
            [1, rows, out, inp],
            [Source::Scratch, w, Source::Scratch],
            false,
        );
        if m.tensors.iter().any(|t| t.name == "bias") {
            let operands = vec![self.scratch(&[0, 1]), self.tensor(&join(&m.path, "bias"), &[1])];
            self.push(&m.path, "vp_bias_add", vec![rows, out], vec![0], operands, vec![]);
        }
        if self.p.adapted(m).is_some() {
            let r = self.p.rank;
            let a = Source::Tensor(format!("{}.lora_A.default.weight", m.path));
            let b = Source::Tensor(format!("{}.lora_B.default.weight", m.path));
            self.gemm(
                &m.path,
                GemmKind::Adapter,
                GemmRole::Forward,
                (false, true),
                [1, rows, r, inp],
                [Source::Scratch, a, Source::Scratch],
                false,
            );
            self.gemm(
                &m.path,
                GemmKind::Adapter,
                GemmRole::Forward,
                (false, true),
                [1, rows, out, r],
                [Source::Scratch, b, Source::Scratch],
                false,
            );
        }
    }

    /// The MLP's activation on `rows × width`, gated (times the up projection) or not.
    fn activation(&mut self, module: &str, rows: u64, width: u64) {
        let f = &self.p.model.facts;
        let a = f.activation.to_ascii_lowercase();
        let mode = if a.contains("relu") {
            3
        } else if a.contains("gelu") && (a.contains("new") || a.contains("tanh") || a.contains("fast")) {
            2
        } else if a.contains("gelu") {
            1
        } else {
            0
        };
        if f.gated_mlp {
            let operands = vec![self.scratch(&[0, 1]), self.scratch(&[0, 1]), self.scratch(&[0, 1])];
            self.push(module, "vp_act_mul", vec![rows, width], vec![0, 1], operands, vec![Param::I32(mode)]);
        } else {
            let operands = vec![self.scratch(&[0, 1]), self.scratch(&[0, 1])];
            self.push(module, "vp_act", vec![rows, width], vec![0, 1], operands, vec![Param::I32(mode)]);
        }
    }

    /// Fused experts: each 3-D weight (or the float form of a quantized one) a GEMM batched over
    /// the experts, the activation before the down projection.
    fn experts(&mut self, m: &Module, routed: u64, count: u64) {
        let f = &self.p.model.facts;
        let hidden = f.hidden_size;
        for t in m.tensors.iter().filter(|t| !t.name.contains("bias") && !t.name.contains("scales")) {
            let path = join(&m.path, &t.name);
            let shape = if t.dtype.is_float() && t.dtype.bits() >= 16 && t.shape.len() == 3 {
                t.shape.clone()
            } else {
                match self.p.model.float_forms.get(&path) {
                    Some(form) if form.shape.len() == 3 => form.shape.clone(),
                    _ => continue,
                }
            };
            let down = t.name.contains("down");
            // Stored [E, out, in] (F.linear) or [E, in, out] (x @ W).
            let (out, inp, trans) = if down {
                if shape[1] == hidden { (shape[1], shape[2], true) } else { (shape[2], shape[1], false) }
            } else if shape[2] == hidden {
                (shape[1], shape[2], true)
            } else {
                (shape[2], shape[1], false)
            };
            if down {
                self.activation(&m.path, routed * count, inp);
            }
            let w = Source::Tensor(path);
            self.gemm(
                &m.path,
                GemmKind::Experts,
                GemmRole::Forward,
                (false, trans),
                [count, routed, out, inp],
                [Source::Scratch, w, Source::Scratch],
                true,
            );
        }
    }

    /// Rotary and the attention core of attention container `m`.
    fn attention(&mut self, m: &Module, tokens: u64) {
        let f = &self.p.model.facts;
        let name = m.name().to_ascii_lowercase();
        let cross = name.contains("encdec") || name.contains("cross");
        let decoder = f
            .layers
            .iter()
            .find(|l| m.path.starts_with(&format!("{}.", l.path)))
            .is_none_or(|l| l.stack == StackKind::Decoder);
        let causal = decoder && !cross;
        let heads = f.num_attention_heads.max(1);
        let (kv_heads, d_qk, d_v) = match f.attention {
            AttentionKind::MultiLatent { v_head_dim, .. } => (heads, f.head_dim, v_head_dim),
            AttentionKind::Standard => (f.num_kv_heads.max(1), f.head_dim, f.head_dim),
        };
        let kv_heads = if heads.is_multiple_of(kv_heads) { kv_heads } else { heads };
        let (b, s) = (self.batch.max(1), self.seq.max(1));
        let inference = self.p.workload.mode == Mode::Inference;
        let (k, v) = if inference {
            (Source::KvCache(0), Source::KvCache(1))
        } else {
            (Source::Scratch, Source::Scratch)
        };
        let e = self.e();
        if let Some(rot) = self.p.rotary.filter(|_| !cross) {
            for (source, h) in [(Source::Scratch, heads), (k.clone(), kv_heads)] {
                let params = vec![
                    Param::U64(h),
                    Param::U64(s),
                    Param::U64(rot.min(d_qk)),
                    Param::F32(THETA),
                    Param::F32(1.0),
                ];
                self.push(
                    &m.path,
                    "vp_rotary",
                    vec![tokens * h, d_qk],
                    vec![0],
                    vec![Operand::new(source, e, &[0, 1])],
                    params,
                );
            }
        }
        let scale = 1.0 / (d_qk as f32).sqrt();
        if self.p.workload.attention == AttentionImpl::Eager {
            let fwd = (GemmKind::Attention, GemmRole::Forward);
            self.gemm(
                &m.path,
                fwd.0,
                fwd.1,
                (false, true),
                [b * heads, s, s, d_qk],
                [Source::Scratch, k, Source::Scratch],
                true,
            );
            let params = vec![Param::I32(i32::from(causal)), Param::U64(s), Param::F32(scale)];
            self.push(
                &m.path,
                "vp_softmax",
                vec![b * heads * s, s],
                vec![0],
                vec![self.scratch(&[0, 1])],
                params,
            );
            self.gemm(
                &m.path,
                fwd.0,
                fwd.1,
                (false, false),
                [b * heads, s, d_v, s],
                [Source::Scratch, v, Source::Scratch],
                true,
            );
        } else {
            let dims = vec![b * kv_heads, heads / kv_heads, s, s, d_qk, d_v];
            let operands = vec![
                self.scratch(&[0, 1, 2, 4]),
                Operand::new(k, e, &[0, 3, 4]),
                Operand::new(v, e, &[0, 3, 5]),
                self.scratch(&[0, 1, 2, 5]),
                Operand::new(Source::Scratch, 4, &[0, 1, 2]),
            ];
            let params = vec![Param::I32(i32::from(causal)), Param::F32(scale)];
            self.push(&m.path, "vp_attention", dims, vec![0, 2, 1, 3], operands, params);
        }
    }

    /// The backward of forward operation `op`.
    pub(super) fn backward(&mut self, op: &Operation) {
        let (module, d) = (op.module.as_str(), op.dims.as_slice());
        let named = |i: usize| match &op.operands[i].source {
            Source::Tensor(path) => Some(path.clone()),
            _ => None,
        };
        let grad = |path: &str| Source::Gradient(path.to_string());
        match &op.work {
            Work::Gemm(g) if g.kind == GemmKind::Attention => {
                // Scores S = Q·Kᵀ: dQ = dS·K, dK = dSᵀ·Q. Context O = P·V: dV = Pᵀ·dO, dP = dO·Vᵀ.
                let (bh, s, n, k) = (d[0], d[1], d[2], d[3]);
                let back = (GemmKind::Attention, GemmRole::InputGrad);
                let sc = || Source::Scratch;
                if g.trans_b {
                    self.gemm(
                        module,
                        back.0,
                        back.1,
                        (false, false),
                        [bh, s, k, n],
                        [sc(), sc(), sc()],
                        true,
                    );
                    self.gemm(module, back.0, back.1, (true, false), [bh, n, k, s], [sc(), sc(), sc()], true);
                } else {
                    self.gemm(module, back.0, back.1, (true, false), [bh, k, n, s], [sc(), sc(), sc()], true);
                    self.gemm(module, back.0, back.1, (false, true), [bh, s, k, n], [sc(), sc(), sc()], true);
                }
            }
            Work::Gemm(g) => {
                let [batch, m, n, k] = [d[0], d[1], d[2], d[3]];
                let b = op.operands[1].source.clone();
                let batched = op.operands[1].spans(0);
                let kind = g.kind;
                // dX[m×k] = dY[m×n]·op(W)ᵀ.
                self.gemm(
                    module,
                    kind,
                    GemmRole::InputGrad,
                    (false, !g.trans_b),
                    [batch, m, k, n],
                    [Source::Scratch, b, Source::Scratch],
                    batched,
                );
                if let Some(w) = named(1).filter(|w| self.p.trains(w)) {
                    // dW stored as W: [n×k] = dYᵀ·X, or [k×n] = Xᵀ·dY.
                    let dims = if g.trans_b { [batch, n, k, m] } else { [batch, k, n, m] };
                    self.gemm(
                        module,
                        kind,
                        GemmRole::WeightGrad,
                        (true, false),
                        dims,
                        [Source::Scratch, Source::Scratch, grad(&w)],
                        batched,
                    );
                }
            }
            Work::Kernel { name, params } => self.kernel_backward(op, name, params),
            Work::Copy => {}
        }
    }

    fn kernel_backward(&mut self, op: &Operation, name: &str, params: &[Param]) {
        let (module, dims) = (op.module.as_str(), op.dims.clone());
        let trained = |i: usize| match &op.operands[i].source {
            Source::Tensor(path) if self.p.trains(path) => Some(path.clone()),
            _ => None,
        };
        let column_sum = |walk: &mut Self, target: String, with_b: bool| {
            let b = if with_b { walk.scratch(&[0, 1]) } else { walk.scratch(&[]) };
            let operands =
                vec![walk.scratch(&[0, 1]), b, Operand::new(Source::Gradient(target), walk.e(), &[1])];
            walk.push(
                module,
                "vp_column_sum",
                dims[..2].to_vec(),
                vec![0],
                operands,
                vec![Param::I32(i32::from(with_b))],
            );
        };
        match name {
            "vp_embedding" => {
                if let Some(table) = trained(1) {
                    let operands = vec![
                        Operand::new(Source::Scratch, 4, &[0]),
                        self.scratch(&[0, 2]),
                        Operand::new(Source::Gradient(table), self.e(), &[1, 2]),
                    ];
                    self.push(module, "vp_embedding_backward", dims, vec![0, 1, 2], operands, vec![]);
                }
            }
            "vp_rms_norm" | "vp_layer_norm" => {
                let rms = i32::from(name == "vp_rms_norm");
                let operands = vec![
                    self.scratch(&[0, 1]),
                    op.operands[1].clone(),
                    self.scratch(&[0, 1]),
                    self.scratch(&[0, 1]),
                ];
                self.push(
                    module,
                    "vp_norm_backward",
                    dims.clone(),
                    vec![0],
                    operands,
                    vec![params[0], Param::I32(rms)],
                );
                if let Some(w) = trained(1) {
                    column_sum(self, w, true);
                }
                if rms == 0
                    && params.get(1) == Some(&Param::I32(1))
                    && let Some(b) = trained(2)
                {
                    column_sum(self, b, false);
                }
            }
            "vp_bias_add" => {
                if let Some(b) = trained(1) {
                    column_sum(self, b, false);
                }
            }
            "vp_act" => {
                let operands = vec![self.scratch(&[0, 1]), self.scratch(&[0, 1]), self.scratch(&[0, 1])];
                self.push(module, "vp_act_backward", dims, vec![0, 1], operands, params.to_vec());
            }
            "vp_act_mul" => {
                let operands = (0..5).map(|_| self.scratch(&[0, 1])).collect();
                self.push(module, "vp_act_mul_backward", dims, vec![0, 1], operands, params.to_vec());
            }
            "vp_rotary" => {
                let mut params = params.to_vec();
                params[4] = Param::F32(-1.0);
                self.push(module, "vp_rotary", dims, vec![0], op.operands.clone(), params);
            }
            "vp_softmax" => {
                let operands = vec![self.scratch(&[0, 1]), self.scratch(&[0, 1])];
                self.push(module, "vp_softmax_backward", dims, vec![0], operands, vec![]);
            }
            "vp_moe_topk" => {
                let operands = vec![self.scratch(&[0, 1]), self.scratch(&[0, 1])];
                self.push(module, "vp_softmax_backward", dims[..2].to_vec(), vec![0], operands, vec![]);
            }
            "vp_attention" => {
                let e = self.e();
                let o = &op.operands;
                let grad_out = self.scratch(&[0, 1, 2, 5]);
                let read = vec![
                    o[0].clone(),
                    o[1].clone(),
                    o[2].clone(),
                    o[3].clone(),
                    grad_out,
                    Operand::new(Source::Scratch, 4, &[0, 1, 2]),
                ];
                let mut q = read.clone();
                q.push(self.scratch(&[0, 1, 2, 4]));
                self.push(
                    module,
                    "vp_attention_backward_q",
                    dims.clone(),
                    vec![0, 2, 1, 3],
                    q,
                    params.to_vec(),
                );
                let mut kv = read;
                kv.extend([
                    Operand::new(Source::Scratch, e, &[0, 3, 4]),
                    Operand::new(Source::Scratch, e, &[0, 3, 5]),
                ]);
                self.push(module, "vp_attention_backward_kv", dims, vec![0, 3, 2, 1], kv, params.to_vec());
            }
            _ => {}
        }
    }
}
