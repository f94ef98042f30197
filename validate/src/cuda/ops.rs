//! The operations the `cuda` backend runs, as data: GEMMs, kernels compiled with NVRTC and copies
//! between devices, each with its sizes (`dims`), the operands it reads and writes and where
//! each operand lives (a model tensor, a gradient, an optimizer state, the activations on the
//! operation's device). Pure: nothing here touches CUDA. `plan.rs` writes these from the model,
//! `bind.rs` places their operands in the program's live allocations, `engine.rs` runs them.
//!
//! An operand's bytes are its element size times the product of the dims it spans (rounded up
//! to 4 bytes, so a 16-bit atomic update's 32-bit word stays inside), so a tile of an operation
//! (smaller dims) reads and writes a compact prefix of each operand's view.

use vramplan_profiles::DType;

/// The element type of an operation's floating-point operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    /// The type computed in for `dtype`: fp16 and bf16 as they are, anything else in fp32.
    pub(crate) fn of(dtype: DType) -> Elem {
        match dtype {
            DType::F16 => Elem::F16,
            DType::BF16 => Elem::Bf16,
            _ => Elem::F32,
        }
    }

    pub(crate) fn bytes(self) -> u64 {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }

    /// The value of `VP_DTYPE` the kernels are compiled with for this type (`kernels.rs`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Elem::F32 => 0,
            Elem::F16 => 1,
            Elem::Bf16 => 2,
        }
    }

    pub(crate) const ALL: [Elem; 3] = [Elem::F32, Elem::F16, Elem::Bf16];
}

/// Where an operand lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A tensor of the model by its full path (a tied name resolved to the tensor it shares),
    /// or a LoRA adapter (`….lora_A.default.weight`), in the allocation that holds it.
    Tensor(String),
    /// The gradient of a trainable tensor, in its unit's gradient allocation.
    Gradient(String),
    /// Optimizer state `n` of a trainable tensor, in its unit's optimizer allocation.
    State(String, u8),
    /// Activations on the operation's device: its live activations, logits and KV caches.
    Scratch,
    /// The running unit's KV cache (inference): its keys (half 0) or its values (half 1); else
    /// scratch.
    KvCache(u8),
    /// The hidden states handed to the running unit at a device boundary, on this GPU.
    Handoff(u32),
}

/// One operand: where it lives, its element size, and the dims it spans (bit `d` for dim `d`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Operand {
    pub source: Source,
    pub elem_bytes: u64,
    pub dims: u32,
}

impl Operand {
    pub(crate) fn new(source: Source, elem_bytes: u64, dims: &[usize]) -> Operand {
        Operand { source, elem_bytes, dims: dims.iter().fold(0, |mask, d| mask | 1 << d) }
    }

    /// Its bytes at `dims`, rounded up to 4.
    pub(crate) fn bytes(&self, dims: &[u64]) -> u64 {
        let elements = dims
            .iter()
            .enumerate()
            .filter(|(d, _)| self.dims & (1 << d) != 0)
            .fold(1u64, |n, (_, size)| n.saturating_mul(*size));
        elements.saturating_mul(self.elem_bytes).div_ceil(4).saturating_mul(4)
    }

    /// Whether it spans dim `d`.
    pub(crate) fn spans(&self, d: usize) -> bool {
        self.dims & (1 << d) != 0
    }
}

/// What a GEMM computes, for the FLOP counts and the reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmKind {
    /// An `nn.Linear` (or `Conv1D`) of the model.
    Linear,
    /// A LoRA adapter's `lora_A` or `lora_B`.
    Adapter,
    /// An MoE router's projection.
    Router,
    /// The routed experts, batched over the experts.
    Experts,
    /// Attention's scores and context (eager).
    Attention,
}

/// Which product of a layer a GEMM is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmRole {
    /// The forward product.
    Forward,
    /// The gradient with respect to the layer's input.
    InputGrad,
    /// The gradient with respect to its weight.
    WeightGrad,
}

/// A row-major GEMM over dims `[batch, m, n, k]`: `C[m×n] = op(A)·op(B)`, A stored `[m×k]`
/// (`[k×m]` when `trans_a`), B stored `[k×n]` (`[n×k]` when `trans_b`), per batch item; B is
/// shared by the batch unless it spans dim 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm {
    pub kind: GemmKind,
    pub role: GemmRole,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// The GEMM dims.
pub(crate) const BATCH: usize = 0;
pub(crate) const M: usize = 1;
pub(crate) const N: usize = 2;
pub(crate) const K: usize = 3;

/// A kernel's extra argument, after its pointers and dims.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Param {
    U64(u64),
    I32(i32),
    F32(f32),
}

/// What an operation is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Work {
    /// A cuBLAS GEMM; operands A, B, C.
    Gemm(Gemm),
    /// An NVRTC kernel of `kernels.rs` by name: its pointers are the operands in order, then its
    /// dims, then `params`.
    Kernel { name: &'static str, params: Vec<Param> },
    /// A copy of dim 0's bytes from operand 0 to operand 1 on another GPU.
    Copy,
}

/// Which pass an operation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    /// The forward again in backward, under activation checkpointing.
    Recompute,
    Backward,
    Loss,
    Optimizer,
    Transfer,
}

/// One operation of a unit's run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Operation {
    /// The module it belongs to (PyTorch's innermost module running).
    pub module: String,
    /// What it is in words (`linear`, `rms_norm`, `attention`), for a mismatch's message.
    pub name: &'static str,
    /// The GPU it runs on.
    pub device: u32,
    pub pass: Pass,
    pub elem: Elem,
    pub work: Work,
    /// Its sizes (a GEMM's are `[batch, m, n, k]`; a kernel's as its signature lists them).
    pub dims: Vec<u64>,
    /// The dims a tile may shrink, in the order they are shrunk.
    pub split: Vec<usize>,
    pub operands: Vec<Operand>,
}

impl Operation {
    /// Floating-point operations of a GEMM (2 per multiply-add); 0 for anything else.
    #[cfg(test)]
    pub(crate) fn gemm_flops(&self) -> u64 {
        self.flops_at(&self.dims)
    }

    /// The same at a tile's `dims`.
    pub(crate) fn flops_at(&self, dims: &[u64]) -> u64 {
        match self.work {
            Work::Gemm(_) => 2 * dims.iter().product::<u64>(),
            _ => 0,
        }
    }

    /// A GEMM over `[batch, m, n, k]` of `elem`, B batched when `b_batched`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        module: &str,
        device: u32,
        pass: Pass,
        elem: Elem,
        gemm: Gemm,
        [batch, m, n, k]: [u64; 4],
        [a, b, c]: [Source; 3],
        b_batched: bool,
    ) -> Operation {
        let e = elem.bytes();
        let b_dims: &[usize] = if b_batched { &[BATCH, K, N] } else { &[K, N] };
        Operation {
            module: module.to_string(),
            name: match gemm.kind {
                GemmKind::Linear | GemmKind::Adapter => "linear",
                GemmKind::Router => "router",
                GemmKind::Experts => "experts",
                GemmKind::Attention => "matmul",
            },
            device,
            pass,
            elem,
            work: Work::Gemm(gemm),
            dims: vec![batch, m, n, k],
            split: vec![BATCH, M, K, N],
            operands: vec![
                Operand::new(a, e, &[BATCH, M, K]),
                Operand::new(b, e, b_dims),
                Operand::new(c, e, &[BATCH, M, N]),
            ],
        }
    }
}

/// A cuBLAS GEMM in its own column-major terms (`cublasGemmStridedBatchedEx`'s arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmCall {
    pub transa: bool,
    pub transb: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: u64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
    pub elem: Elem,
}

/// The most a GEMM dim may be (cuBLAS takes `int`s).
pub(crate) const GEMM_DIM_LIMIT: u64 = i32::MAX as u64;

/// The column-major call for a row-major `gemm` at `[batch, m, n, k]` on compact operands at
/// `pointers` (A, B, C): row-major `C = op(A)·op(B)` is column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`,
/// so cuBLAS's A is our B and its B our A. `None` where a dim passes `int`.
pub(crate) fn gemm_call(
    gemm: Gemm,
    elem: Elem,
    dims: &[u64],
    pointers: [u64; 3],
    b_batched: bool,
) -> Option<GemmCall> {
    let [batch, m, n, k] = [dims[BATCH], dims[M], dims[N], dims[K]];
    let int = |v: u64| i32::try_from(v).ok();
    let long = |v: u64| i64::try_from(v).ok();
    Some(GemmCall {
        transa: gemm.trans_b,
        transb: gemm.trans_a,
        m: int(n)?,
        n: int(m)?,
        k: int(k)?,
        a: pointers[1],
        lda: int(if gemm.trans_b { k } else { n })?,
        stride_a: if b_batched { long(n.checked_mul(k)?)? } else { 0 },
        b: pointers[0],
        ldb: int(if gemm.trans_a { m } else { k })?,
        stride_b: long(m.checked_mul(k)?)?,
        c: pointers[2],
        ldc: int(n)?,
        stride_c: long(m.checked_mul(n)?)?,
        batch: int(batch)?,
        elem,
    })
}

/// How a kernel maps its work to threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// One thread per item of the product of these dims.
    Threads(&'static [usize]),
    /// One block of 256 threads per row, rows the product of these dims.
    BlockPerRow(&'static [usize]),
    /// One warp per row, rows the product of these dims.
    WarpPerRow(&'static [usize]),
}

/// The most blocks a launch takes: every kernel loops over its work with a grid stride.
pub(crate) const MAX_BLOCKS: u64 = 1 << 20;

/// Grid and block of a launch of `shape` at `dims`: `(blocks, threads per block)`.
pub(crate) fn geometry(shape: Shape, dims: &[u64]) -> (u32, u32) {
    let product = |ds: &[usize]| ds.iter().fold(1u64, |n, d| n.saturating_mul(dims[*d]));
    let (blocks, threads) = match shape {
        Shape::Threads(ds) => (product(ds).div_ceil(256), 256),
        Shape::BlockPerRow(ds) => (product(ds), 256),
        Shape::WarpPerRow(ds) => (product(ds).div_ceil(4), 128),
    };
    (blocks.clamp(1, MAX_BLOCKS) as u32, threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORWARD: Gemm =
        Gemm { kind: GemmKind::Linear, role: GemmRole::Forward, trans_a: false, trans_b: true };

    /// A column-major matrix of `rows × cols` with leading dimension `ld`, transposed or not,
    /// spans `ld × (its stored columns)` elements: the extents cuBLAS reads stay within the
    /// row-major operands' sizes (`m·k`, `k·n`, `m·n`).
    fn extent(trans: bool, rows: i32, cols: i32, ld: i32) -> i64 {
        let (stored_rows, stored_cols) = if trans { (cols, rows) } else { (rows, cols) };
        assert!(ld >= stored_rows, "ld {ld} below the {stored_rows} stored rows");
        i64::from(ld) * i64::from(stored_cols)
    }

    #[test]
    fn column_major_calls_read_exactly_the_row_major_operands() {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            let gemm = Gemm { trans_a, trans_b, ..FORWARD };
            let (m, n, k) = (7u64, 5u64, 3u64);
            let call = gemm_call(gemm, Elem::F32, &[2, m, n, k], [10, 20, 30], true).unwrap();
            // cuBLAS's op(A) is m_c × k_c, op(B) k_c × n_c, C m_c × n_c with m_c = n, n_c = m.
            assert_eq!((call.m, call.n, call.k), (n as i32, m as i32, k as i32));
            assert_eq!(extent(call.transa, call.m, call.k, call.lda), (k * n) as i64);
            assert_eq!(extent(call.transb, call.k, call.n, call.ldb), (m * k) as i64);
            assert_eq!(i64::from(call.ldc) * i64::from(call.n), (m * n) as i64);
            assert_eq!((call.a, call.b, call.c), (20, 10, 30), "cuBLAS's A is our B");
            assert_eq!(
                (call.stride_a, call.stride_b, call.stride_c),
                ((n * k) as i64, (m * k) as i64, (m * n) as i64)
            );
        }
        // A forward linear: y = x·Wᵀ, W stored [out × in] — cuBLAS transposes W, not x.
        let call = gemm_call(FORWARD, Elem::Bf16, &[1, 4096, 11008, 4096], [1, 2, 3], false).unwrap();
        assert!(call.transa && !call.transb);
        assert_eq!((call.lda, call.ldb, call.ldc, call.stride_a), (4096, 4096, 11008, 0));
        assert!(gemm_call(FORWARD, Elem::F32, &[1, 1 << 31, 8, 8], [0; 3], false).is_none());
    }

    #[test]
    fn operand_sizes_follow_their_dims_rounded_to_four_bytes() {
        let op = Operation::gemm(
            "m",
            0,
            Pass::Forward,
            Elem::Bf16,
            FORWARD,
            [1, 3, 5, 7],
            [Source::Scratch, Source::Tensor("w".into()), Source::Scratch],
            false,
        );
        let sizes: Vec<u64> = op.operands.iter().map(|o| o.bytes(&op.dims)).collect();
        assert_eq!(sizes, vec![(3 * 7 * 2u64).div_ceil(4) * 4, 5 * 7 * 2 + 2, 3 * 5 * 2 + 2]);
        assert_eq!(op.gemm_flops(), 2 * 3 * 5 * 7);
    }

    #[test]
    fn launches_cover_their_work_and_stay_within_the_grid() {
        assert_eq!(geometry(Shape::Threads(&[0, 1]), &[1000, 3]), (12, 256));
        assert_eq!(geometry(Shape::BlockPerRow(&[0]), &[17, 4096]), (17, 256));
        assert_eq!(geometry(Shape::WarpPerRow(&[0, 1]), &[3, 3]), (3, 128));
        assert_eq!(geometry(Shape::Threads(&[0]), &[u64::MAX]), (MAX_BLOCKS as u32, 256));
        assert_eq!(geometry(Shape::Threads(&[0]), &[0]), (1, 256));
    }
}
