//! What the training frameworks do differently, each checked against a closed form from the
//! framework's code: bitsandbytes' paged optimizers (states in CUDA managed memory, outside
//! PyTorch's allocator), torchtune's optimizer in backward (no step with every gradient alive),
//! Unsloth's kernels and fused loss, and the attention transformers falls back to.

use vramplan_profiles::model::{self, ImportOptions, ModelDescription, TensorKind};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::workload::{
    AttentionImpl, Finetune, GradCheckpointing, Mode, Optimizer, Quant, Trainer, Workload,
};
use vramplan_sim::{Placement, estimate, saved_activation_bytes};

fn builtin(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in model")
}

fn full_bf16(batch: u64, seq: u64) -> Workload {
    Workload { mode: Mode::Train, batch, seq, weight_dtype: Some(DType::BF16), ..Workload::default() }
}

/// Every trainable tensor of a full fine-tune, counted once (tied ones are one tensor).
fn parameter_sizes(model: &ModelDescription) -> Vec<u64> {
    let mut sizes = Vec::new();
    model.root.visit(&mut |m| {
        for t in &m.tensors {
            if t.kind == TensorKind::Parameter && t.tied_to.is_none() {
                sizes.push(t.numel());
            }
        }
    });
    sizes
}

#[test]
fn paged_optimizer_states_leave_pytorchs_allocator_and_stay_in_device_used() {
    let model = builtin("llama-3.2-1b");
    let hw = hardware::load("h100-80gb").expect("profile");
    let run = |optimizer| {
        let w = Workload { optimizer, ..full_bf16(1, 256) };
        estimate(&model, &hw, &w, &Placement::single(0)).expect("estimate").devices.remove(0)
    };
    let plain = run(Optimizer::Adamw8bit);
    let paged = run(Optimizer::PagedAdamw8bit);
    // bitsandbytes `get_state_buffer`: the two uint8 states of every tensor of at least 10⁵
    // values are paged; smaller tensors' states and the absmax blocks are not.
    let sizes = parameter_sizes(&model);
    let paged_bytes: u64 = sizes.iter().filter(|n| **n >= 100_000).map(|n| 2 * n).sum();
    assert!(paged_bytes > 2_000_000_000, "llama-3.2-1b pages its big tensors' states");
    // Both peaks are where every state is alive; each allocation is rounded to 512 bytes.
    let slack = 512 * sizes.len() as u64;
    let gone = plain.peak_allocated_bytes - paged.peak_allocated_bytes;
    assert!(gone.abs_diff(paged_bytes) <= slack, "allocated fell by {gone}, paged states are {paged_bytes}");
    // nvidia-smi sees managed memory while it is resident.
    assert!(paged.device_used_bytes >= paged.peak_reserved_bytes + paged_bytes);
}

#[test]
fn optimizer_in_backward_never_holds_every_gradient() {
    let model = builtin("llama-3.2-3b");
    let hw = hardware::load("a100-80gb").expect("profile");
    let base = Workload {
        trainer: Trainer::Torchtune,
        grad_checkpointing: GradCheckpointing::Full,
        ..full_bf16(2, 1024)
    };
    let mut in_backward = base.clone();
    in_backward.switches.optimizer_in_backward = true;
    let run =
        |w: &Workload| estimate(&model, &hw, w, &Placement::single(0)).expect("estimate").devices.remove(0);
    let (normal, fused) = (run(&base), run(&in_backward));
    let all_gradients: u64 = parameter_sizes(&model).iter().map(|n| 2 * n).sum();
    // The largest gradient one unit makes: the tied embedding's, which autograd holds three
    // of while it sums the head's and the embedding's (the traced full fine-tunes of the tied
    // Llama 3.2 1B, Qwen2.5 and Gemma 2 in tracer.rs peak there).
    let embedding = 2 * 128_256 * 3072;
    // Each charged as the allocator does: at most 1 MiB of an unsplit remainder on top.
    assert!(fused.components.gradients <= 3 * (embedding + (1 << 20)), "{}", fused.components.gradients);
    // Without it, the step's optimizer runs with every gradient alive: the end of backward
    // holds them all, on top of the weights and states both runs hold.
    assert!(normal.peak_allocated_bytes >= normal.steady_bytes + all_gradients);
    assert!(fused.peak_allocated_bytes < normal.peak_allocated_bytes);
}

fn unsloth_qlora(batch: u64, seq: u64) -> Workload {
    Workload {
        trainer: Trainer::Unsloth,
        quant: Quant::Nf4 { double_quant: true },
        finetune: Finetune::Lora {
            rank: 16,
            alpha: 16,
            targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
        },
        optimizer: Optimizer::Adamw8bit,
        ..Workload { weight_dtype: Some(DType::F16), ..full_bf16(batch, seq) }
    }
}

#[test]
fn unsloth_layers_keep_what_its_kernels_save() {
    // Llama-3-8B: h 4096, 32 heads of 128, 8 KV heads, MLP 14336, fp16. Per token: the two
    // norms' inputs and the two LoRA kernels' inputs (4·h), q, K and V expanded to every head and
    // the attention output (4·a·d), gate and up (2·I), in 2 bytes; two fp32 inverse RMS and a
    // log-sum-exp per head in fp32.
    let model = builtin("llama-3-8b");
    let w = unsloth_qlora(1, 512);
    let per_token = 2 * (4 * 4096 + 4 * 32 * 128 + 2 * 14_336) + 2 * 4 + 4 * 32;
    assert_eq!(saved_activation_bytes(&model, &w, 0), per_token * 512);
}

#[test]
fn unsloth_fused_loss_keeps_no_logits_and_runs_one_chunk_at_a_time() {
    use vramplan_sim::program::{Alloc, Component, Op, step_program};
    let model = builtin("llama-3-8b");
    let hw = hardware::load("h100-80gb").expect("profile");
    let (hidden, vocab) = (4096u64, 128_256u64);
    // unsloth_zoo 2026.10.9 `fused_linear_cross_entropy` (`_ce_impl`), fp16 on an 80 GB Hopper
    // card (`_flash_min_rows_auto`: 4096 rows over 24.5 GiB), frozen head. From 4096 rows the tiled
    // pass: 4096 rows x 16,384 fp32 columns (256 MiB, `_tiled_layout`), an fp32 4096 x hidden
    // accumulator, the running maximum, the 8 x 8-split partials and per row an fp32 log-probability
    // and log-sum-exp. Under 4096 rows the chunked pass: 512 rows (`fused_linear_rows`: 1024 x
    // 4096 / 128,256 = 32.7 -> 32, raised to the pow2 below 512 x 151,936 / 128,256) of fp32
    // logits, the fp32 512 x hidden gradient, the 7 x 8-split partials, an fp32 log-probability a row.
    let tiled = |tokens: u64| 4096 * 16384 * 4 + 4096 * hidden * 4 + 4096 * 4 + 8 * 8 * 4096 * 4 + 8 * tokens;
    let chunked = |tokens: u64| 512 * vocab * 4 + 512 * hidden * 4 + 7 * 8 * 512 * 4 + 4 * tokens;
    for (batch, seq, expected) in
        [(1u64, 1024u64, chunked(1024)), (2, 2048, tiled(4096)), (8, 2048, tiled(16384))]
    {
        let w = Workload { grad_checkpointing: GradCheckpointing::Full, ..unsloth_qlora(batch, seq) };
        let program = step_program(&model, &hw, &w, &Placement::single(0));
        let logits: Vec<u64> = program
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc(Alloc { component: Component::Logits, bytes, .. }) => Some(*bytes),
                _ => None,
            })
            .collect();
        // Per step, one chunk's buffers; nothing of the whole logits.
        assert_eq!(logits, vec![expected; 2], "{batch}x{seq}");
    }
}

#[test]
fn gemma_2_runs_eager_attention_whatever_is_asked() {
    // Gemma 2 sets `_supports_sdpa = False` (logit softcapping): asked for SDPA by default,
    // transformers falls back to eager attention.
    let model = builtin("gemma-2-2b");
    let sdpa = Workload { attention: AttentionImpl::Sdpa, ..full_bf16(1, 512) };
    let eager = Workload { attention: AttentionImpl::Eager, ..full_bf16(1, 512) };
    assert_eq!(saved_activation_bytes(&model, &sdpa, 0), saved_activation_bytes(&model, &eager, 0));
    let llama = builtin("llama-3.2-1b");
    assert!(saved_activation_bytes(&llama, &sdpa, 0) < saved_activation_bytes(&llama, &eager, 0));
}

#[test]
fn unsloth_outside_what_it_models_is_warned() {
    let hw = hardware::load("t4").expect("profile");
    let warned = |name: &str, w: &Workload| {
        let model = builtin(name);
        vramplan_sim::input::validate(w, &model, &hw)
            .expect("valid")
            .iter()
            .any(|m| m.contains("trainer: unsloth"))
    };
    let lora = unsloth_qlora(1, 512);
    let full = Workload { trainer: Trainer::Unsloth, ..full_bf16(1, 512) };
    assert!(!warned("llama-3.2-1b", &lora));
    assert!(warned("llama-3.2-1b", &full), "a full fine-tune");
    let gpt2_lora = Workload {
        quant: Quant::None,
        finetune: Finetune::Lora { rank: 16, alpha: 16, targets: vec!["c_attn".into()] },
        ..lora.clone()
    };
    assert!(warned("gpt2", &gpt2_lora), "LayerNorm, plain MLP");
    let attention_lora = Workload {
        finetune: Finetune::Lora { rank: 16, alpha: 16, targets: vec!["q_proj".into(), "v_proj".into()] },
        ..gpt2_lora
    };
    assert!(warned("olmoe-1b-7b", &attention_lora), "experts");
}

#[test]
fn each_trainer_refuses_what_its_program_does_not_run() {
    let model = builtin("llama-3.2-1b");
    let hw = hardware::load("2xa100-80gb").expect("profile");
    let qlora = |trainer| Workload {
        finetune: Finetune::Lora { rank: 8, alpha: 16, targets: Vec::new() },
        quant: Quant::Nf4 { double_quant: false },
        trainer,
        ..full_bf16(1, 256)
    };
    let refused_at = |w: Workload, key: &str| {
        let e = vramplan_sim::input::validate(&w, &model, &hw).expect_err("refused");
        assert!(e.to_string().contains(&format!("key `{key}`")), "{e}");
    };
    // LitGPT: bitsandbytes' quantizations only (`litgpt/finetune/lora.py`), one GPU, PagedAdamW.
    let litgpt = Workload { optimizer: Optimizer::PagedAdamw, ..qlora(Trainer::Litgpt) };
    vramplan_sim::input::validate(&litgpt, &model, &hw).expect("LitGPT's QLoRA as it runs");
    refused_at(Workload { quant: Quant::Gptq { bits: 4, group_size: 128 }, ..litgpt.clone() }, "quant");
    refused_at(Workload { optimizer: Optimizer::Adamw, ..litgpt.clone() }, "optimizer");
    let ddp = vramplan_sim::workload::Parallelism::Ddp;
    refused_at(Workload { parallelism: ddp, ..litgpt.clone() }, "parallelism");
    // fsdp_qlora: nf4 `Linear4bit` only.
    refused_at(Workload { quant: Quant::Int8, ..qlora(Trainer::FsdpQlora) }, "quant");
    // A loss of their own: torchtune's chunked loss does not apply.
    for trainer in [Trainer::Unsloth, Trainer::Litgpt, Trainer::FsdpQlora] {
        let mut w = Workload { optimizer: Optimizer::PagedAdamw, ..qlora(trainer) };
        w.switches.chunked_cross_entropy = true;
        refused_at(w, "switches.chunked_cross_entropy");
    }
}
