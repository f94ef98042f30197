//! The kernels the `cuda` backend compiles at run time with NVRTC, as CUDA C source, and the
//! table of their signatures the launches follow: embeddings, norms, activations, rotary,
//! attention (eager softmax, and a memory-efficient kernel with an online softmax that keeps no
//! scores), MoE top-k routing, cross-entropy, their backwards, and the SGD and AdamW updates.
//!
//! One source, compiled once per element type (`VP_DTYPE`: 0 fp32, 1 fp16, 2 bf16; 16-bit
//! values are converted by hand, so no CUDA header is needed, by NVRTC or by the syntax check
//! in the tests). Every kernel walks its work with a grid stride, so any grid runs it all; it
//! takes its operand pointers, then its dims (`unsigned long long`, in the order of the
//! operation's dims), then its parameters, and reads and writes exactly the elements its
//! operands' dims span (`ops.rs`). Token ids and labels are read from activation memory whose
//! contents are random: they are taken modulo the vocabulary, so every read stays in bounds.

use super::ops::Shape;

/// A pointer argument's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pointer {
    /// `const elem*` (read).
    In,
    /// `elem*` (written).
    Out,
    /// `const unsigned int*`: token ids, labels.
    Ids,
    /// `unsigned int*`: expert indices written.
    IdsOut,
    /// `const float*`: a log-sum-exp read.
    F32In,
    /// `float*`: a log-sum-exp or loss written.
    F32Out,
}

/// A parameter's type, after the dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParamType {
    U64,
    I32,
    F32,
}

/// One kernel's signature: what a launch passes, and how it maps work to threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signature {
    pub name: &'static str,
    pub pointers: &'static [Pointer],
    pub dims: usize,
    pub params: &'static [ParamType],
    pub shape: Shape,
}

use ParamType::{F32, I32, U64};
use Pointer::{F32In, F32Out, Ids, IdsOut, In, Out};

/// Every kernel of [`SOURCE`].
pub(crate) const SIGNATURES: &[Signature] = &[
    // dims [rows, vocab, width]
    Signature {
        name: "vp_embedding",
        pointers: &[Ids, In, Out],
        dims: 3,
        params: &[],
        shape: Shape::Threads(&[0, 2]),
    },
    Signature {
        name: "vp_embedding_backward",
        pointers: &[Ids, In, Out],
        dims: 3,
        params: &[],
        shape: Shape::Threads(&[0, 2]),
    },
    // dims [rows, width]; eps
    Signature {
        name: "vp_rms_norm",
        pointers: &[In, In, Out],
        dims: 2,
        params: &[F32],
        shape: Shape::BlockPerRow(&[0]),
    },
    // x, weight, bias, y; eps, has_bias
    Signature {
        name: "vp_layer_norm",
        pointers: &[In, In, In, Out],
        dims: 2,
        params: &[F32, I32],
        shape: Shape::BlockPerRow(&[0]),
    },
    // x, weight, dy, dx; eps, rms
    Signature {
        name: "vp_norm_backward",
        pointers: &[In, In, In, Out],
        dims: 2,
        params: &[F32, I32],
        shape: Shape::BlockPerRow(&[0]),
    },
    // dims [rows, cols]: out[c] = Σ_r a[r,c]·(b[r,c] when has_b); has_b
    Signature {
        name: "vp_column_sum",
        pointers: &[In, In, Out],
        dims: 2,
        params: &[I32],
        shape: Shape::Threads(&[1]),
    },
    // dims [rows, cols]: y += bias
    Signature {
        name: "vp_bias_add",
        pointers: &[Out, In],
        dims: 2,
        params: &[],
        shape: Shape::Threads(&[0, 1]),
    },
    // dims [rows, width]; mode (0 silu, 1 gelu, 2 gelu tanh, 3 relu)
    Signature {
        name: "vp_act",
        pointers: &[In, Out],
        dims: 2,
        params: &[I32],
        shape: Shape::Threads(&[0, 1]),
    },
    Signature {
        name: "vp_act_mul",
        pointers: &[In, In, Out],
        dims: 2,
        params: &[I32],
        shape: Shape::Threads(&[0, 1]),
    },
    Signature {
        name: "vp_act_backward",
        pointers: &[In, In, Out],
        dims: 2,
        params: &[I32],
        shape: Shape::Threads(&[0, 1]),
    },
    // gate, up, dy, dgate, dup
    Signature {
        name: "vp_act_mul_backward",
        pointers: &[In, In, In, Out, Out],
        dims: 2,
        params: &[I32],
        shape: Shape::Threads(&[0, 1]),
    },
    // dims [rows, head_dim] (rows = tokens × heads), in place; heads, seq, rot_dim, theta, sign
    Signature {
        name: "vp_rotary",
        pointers: &[Out],
        dims: 2,
        params: &[U64, U64, U64, F32, F32],
        shape: Shape::Threads(&[0, 1]),
    },
    // dims [rows, cols], in place; causal, seq_q, scale
    Signature {
        name: "vp_softmax",
        pointers: &[Out],
        dims: 2,
        params: &[I32, U64, F32],
        shape: Shape::BlockPerRow(&[0]),
    },
    // y, dy (the gradient written into dy)
    Signature {
        name: "vp_softmax_backward",
        pointers: &[In, Out],
        dims: 2,
        params: &[],
        shape: Shape::BlockPerRow(&[0]),
    },
    // dims [groups, per_group, seq_q, seq_k, d_qk, d_v]: q, k, v, o, lse; causal, scale
    Signature {
        name: "vp_attention",
        pointers: &[In, In, In, Out, F32Out],
        dims: 6,
        params: &[I32, F32],
        shape: Shape::WarpPerRow(&[0, 1, 2]),
    },
    // q, k, v, o, do, lse, dq
    Signature {
        name: "vp_attention_backward_q",
        pointers: &[In, In, In, In, In, F32In, Out],
        dims: 6,
        params: &[I32, F32],
        shape: Shape::WarpPerRow(&[0, 1, 2]),
    },
    // q, k, v, o, do, lse, dk, dv
    Signature {
        name: "vp_attention_backward_kv",
        pointers: &[In, In, In, In, In, F32In, Out, Out],
        dims: 6,
        params: &[I32, F32],
        shape: Shape::WarpPerRow(&[0, 3]),
    },
    // dims [rows, experts, k]: logits, indices, weights
    Signature {
        name: "vp_moe_topk",
        pointers: &[In, IdsOut, Out],
        dims: 3,
        params: &[],
        shape: Shape::Threads(&[0]),
    },
    // dims [rows, vocab]: logits, labels, loss
    Signature {
        name: "vp_cross_entropy",
        pointers: &[In, Ids, F32Out],
        dims: 2,
        params: &[],
        shape: Shape::BlockPerRow(&[0]),
    },
    Signature {
        name: "vp_cross_entropy_backward",
        pointers: &[In, Ids, Out],
        dims: 2,
        params: &[],
        shape: Shape::BlockPerRow(&[0]),
    },
    // dims [n]: param, grad, exp_avg, exp_avg_sq; lr, beta1, beta2, eps, weight_decay, step
    Signature {
        name: "vp_adamw",
        pointers: &[Out, In, Out, Out],
        dims: 1,
        params: &[F32, F32, F32, F32, F32, I32],
        shape: Shape::Threads(&[0]),
    },
    // param, grad; lr
    Signature { name: "vp_sgd", pointers: &[Out, In], dims: 1, params: &[F32], shape: Shape::Threads(&[0]) },
    // param, grad, momentum buffer; lr, momentum
    Signature {
        name: "vp_sgd_momentum",
        pointers: &[Out, In, Out],
        dims: 1,
        params: &[F32, F32],
        shape: Shape::Threads(&[0]),
    },
];

/// The signature of kernel `name`.
pub(crate) fn signature(name: &str) -> Option<&'static Signature> {
    SIGNATURES.iter().find(|s| s.name == name)
}

/// The source for element type `code` (`ops::Elem::code`).
pub(crate) fn source(code: u32) -> String {
    format!("#define VP_DTYPE {code}\n{SOURCE}")
}

/// The kernels (`kernels.cu`), after a `#define VP_DTYPE`.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel's parameter list in the source, split at commas.
    fn declared(name: &str) -> Vec<String> {
        let start =
            SOURCE.find(&format!("void {name}(")).unwrap_or_else(|| panic!("{name} not in the source"));
        let open = start + SOURCE[start..].find('(').unwrap();
        let close = open + SOURCE[open..].find(')').unwrap();
        SOURCE[open + 1..close]
            .split(',')
            .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    /// Every launch passes what its kernel declares: the pointers (of the declared types), the
    /// dims as `ULL`s, then the parameters, in that order and number.
    #[test]
    fn every_signature_matches_its_kernel_in_the_source() {
        for s in SIGNATURES {
            let params = declared(s.name);
            assert_eq!(params.len(), s.pointers.len() + s.dims + s.params.len(), "{}: {params:?}", s.name);
            for (p, kind) in params.iter().zip(s.pointers) {
                let expected = match kind {
                    Pointer::In => "const elem*",
                    Pointer::Out => "elem*",
                    Pointer::Ids => "const unsigned int*",
                    Pointer::IdsOut => "unsigned int*",
                    Pointer::F32In => "const float*",
                    Pointer::F32Out => "float*",
                };
                assert!(
                    p.starts_with(expected) && !p[expected.len()..].contains('*'),
                    "{}: {p} is not {expected}",
                    s.name
                );
            }
            for p in &params[s.pointers.len()..s.pointers.len() + s.dims] {
                assert!(p.starts_with("ULL "), "{}: dim {p}", s.name);
            }
            for (p, kind) in params[s.pointers.len() + s.dims..].iter().zip(s.params) {
                let expected = match kind {
                    ParamType::U64 => "ULL ",
                    ParamType::I32 => "int ",
                    ParamType::F32 => "float ",
                };
                assert!(p.starts_with(expected), "{}: {p} is not {expected}", s.name);
            }
        }
        let kernels = SOURCE.matches("extern \"C\" __global__").count();
        assert_eq!(kernels, SIGNATURES.len(), "a kernel without a signature, or the reverse");
    }

    /// Stubs for what NVRTC provides, so that a host C++ compiler checks the kernels' syntax
    /// and types (not their meaning on a GPU).
    const PRELUDE: &str = r#"
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct vp_dim3 { unsigned int x, y, z; };
extern vp_dim3 blockIdx, threadIdx, blockDim, gridDim;
float __uint_as_float(unsigned int);
unsigned int __float_as_uint(float);
float __int_as_float(int);
float __shfl_xor_sync(unsigned int, float, int);
void __syncthreads();
float atomicAdd(float*, float);
unsigned int atomicCAS(unsigned int*, unsigned int, unsigned int);
float expf(float); float logf(float); float erff(float); float tanhf(float); float powf(float, float);
float cosf(float); float sinf(float); float sqrtf(float); float rsqrtf(float); float fmaxf(float, float);
"#;

    /// Where `c++` or `g++` is on the PATH, every element type's source compiles as C++ after
    /// the stubs (`-fsyntax-only`, warnings as errors); elsewhere the check is skipped, and
    /// says so.
    #[test]
    fn the_kernel_sources_compile_as_cpp_with_stubs() {
        let compiler = ["c++", "g++"].into_iter().find(|c| {
            std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success())
        });
        let Some(compiler) = compiler else {
            eprintln!("no c++ or g++ on the PATH: the kernels' syntax is not checked");
            return;
        };
        let dir = std::env::temp_dir().join(format!("vramplan-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for code in 0..3 {
            let path = dir.join(format!("kernels_{code}.cpp"));
            std::fs::write(&path, format!("{PRELUDE}\n{}", source(code))).unwrap();
            let out = std::process::Command::new(compiler)
                .args([
                    "-fsyntax-only",
                    "-x",
                    "c++",
                    "-std=c++14",
                    "-Wall",
                    "-Werror",
                    "-Wno-unused-function",
                ])
                .arg(&path)
                .output()
                .unwrap();
            if !out.status.success() {
                std::fs::remove_dir_all(&dir).ok();
                panic!("VP_DTYPE {code}:\n{}", String::from_utf8_lossy(&out.stderr));
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
