//! vLLM's pipeline-parallel ranks (`sim/src/engines/pipeline_stage.rs`, `vllm::stage_budget`)
//! against closed forms from the published configs: what each stage holds of Llama-3.1-70B
//! (untied) and Llama-3.2-1B (tied), its KV cache per token, and the sampler on the last stage
//! only; the estimate's ranks in vLLM's order, with every rank at the smallest rank's blocks.

use vramplan_profiles::hardware::{self, Device};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::engines::estimate::vllm_estimate;
use vramplan_sim::engines::pipeline_stage::{Stage, stage_model};
use vramplan_sim::engines::vllm::{self, VllmBudget};
use vramplan_sim::workload::{Engine, Parallelism, Workload};

fn device() -> Device {
    hardware::load("h100-80gb").expect("a hardware profile").devices[0].clone()
}

fn builtin(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("a built-in model")
}

fn serve(tp: u32, pp: u32) -> Workload {
    Workload {
        seq: 8192,
        parallelism: Parallelism::Tensor { size: tp, pipeline: pp },
        engine: Engine::Vllm { gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192 },
        ..Workload::default()
    }
}

fn stage(model: &ModelDescription, tp: u32, index: u32, count: u32) -> VllmBudget {
    vllm::stage_budget(model, &device(), &serve(tp, count), tp, Stage { index, count }).expect("a budget")
}

/// Llama-3.1-70B (meta-llama config.json): hidden 8192, 64 heads, 8 KV heads of 128, MLP 28672,
/// 80 layers, vocabulary 128256, untied head, 131072 positions.
#[test]
fn each_stage_of_an_untied_model_holds_its_layers_and_its_end() {
    let model = builtin("llama-3.1-70b");
    let whole = stage(&model, 8, 0, 1);
    let (first, last) = (stage(&model, 8, 0, 2), stage(&model, 8, 1, 2));
    // vLLM's rotary `cos_sin_cache` (131072 × 128 in bf16) is built on every rank.
    let rotary = 131072 * 128 * 2;
    let layer = (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192) / 8 * 2 + 2 * 8192 * 2;
    // The embedding and the head: vocabulary-parallel, 128256 rows padded to a multiple of
    // 64 × 8 (128512), / 8.
    let embedding = 128512 / 8 * 8192 * 2;
    assert_eq!(first.weights_bytes, 40 * layer + embedding + rotary, "stage 0: embedding + layers 0-39");
    assert_eq!(
        last.weights_bytes,
        40 * layer + embedding + 8192 * 2 + rotary,
        "stage 1: layers 40-79 + norm + head"
    );
    assert_eq!(first.weights_bytes + last.weights_bytes, whole.weights_bytes + rotary);
    // Each stage caches K and V of its 40 layers: 2 × 1 head × 128 × 2 bytes each.
    assert_eq!(first.kv_bytes_per_token, 40 * 2 * 128 * 2);
    assert_eq!(first.kv_bytes_per_token * 2, whole.kv_bytes_per_token);
    // The sampler (logits over the vocabulary) runs on the last stage only.
    assert_eq!(last.activation_peak_at, "sampler");
    assert_ne!(first.activation_peak_at, "sampler");
    assert!(first.activation_peak_bytes < last.activation_peak_bytes);
}

/// Llama-3.2-1B ties its head to the embedding; with two stages the last one holds the head as a
/// weight of its own (vLLM loads the embedding's values into it).
#[test]
fn a_tied_head_is_a_weight_of_its_own_on_the_last_stage() {
    let model = builtin("llama-3.2-1b");
    let whole = stage(&model, 1, 0, 1);
    let (first, last) = (stage(&model, 1, 0, 2), stage(&model, 1, 1, 2));
    let embedding = 128256 * 2048 * 2;
    let rotary = 131072 * 64 * 2;
    assert_eq!(first.weights_bytes + last.weights_bytes, whole.weights_bytes + embedding + rotary);
    // The tied head is the last stage's alone (it holds no bytes of its own while tied, yet it
    // is a module with weights, not a rotary-like buffer module every stage builds).
    for name in ["llama-3.2-1b", "gpt2"] {
        let first = stage_model(&builtin(name), Stage { index: 0, count: 2 });
        assert!(!first.has_path("lm_head"), "{name}: stage 0 holds no head");
    }
    let staged = stage_model(&model, Stage { index: 1, count: 2 });
    assert!(!staged.has_path("model.embed_tokens"));
    assert!(
        staged.has_path("lm_head") && staged.has_path("model.layers.8") && !staged.has_path("model.layers.7")
    );
}

#[test]
fn ranks_follow_vllms_order_and_share_the_smallest_ranks_blocks() {
    let model = builtin("llama-3.1-70b");
    let profile = hardware::load("h100-80gb-x8-n2").expect("a profile");
    let estimate = vllm_estimate(&model, &profile, &serve(8, 2)).expect("an estimate");
    assert_eq!(estimate.devices.len(), 16);
    let (first, last) = (stage(&model, 8, 0, 2), stage(&model, 8, 1, 2));
    let blocks = |b: &VllmBudget| b.kv_capacity_tokens;
    let capacity = blocks(&first).min(blocks(&last));
    assert_eq!(estimate.kv_capacity_tokens, Some(capacity));
    for (rank, d) in estimate.devices.iter().enumerate() {
        let b = if rank < 8 { &first } else { &last };
        assert_eq!(d.components.weights, b.weights_bytes, "rank {rank}");
        // The smallest rank keeps what it had; the others shrink to its blocks (16 tokens each).
        let kv = d.components.kv_cache;
        assert!(
            kv >= capacity * b.kv_bytes_per_token && kv < (capacity + 16) * b.kv_bytes_per_token,
            "rank {rank}"
        );
        if blocks(b) > capacity {
            assert_eq!(kv, capacity * b.kv_bytes_per_token, "rank {rank}");
        }
    }
    assert!(blocks(&first) > blocks(&last), "the sampler's logits leave the last stage less room");
    // Tensor parallel 16 instead: the 8 KV heads are replicated, so twice the KV per token and
    // a warning that names the pipeline layout.
    let across = vllm_estimate(&model, &profile, &serve(16, 1)).expect("an estimate");
    assert!(across.kv_capacity_tokens < estimate.kv_capacity_tokens);
    assert!(across.warnings.iter().any(|w| w.contains("--parallel tp=8,pp=2")), "{:?}", across.warnings);
}

/// Data parallelism replicates the group, but vLLM's MoE layers flatten the tensor-parallel
/// group across it (`flatten_tp_across_dp_and_pcp`: "TP = 2, DP = 2 and EP = False … sharded
/// across 4 devices"): at tp 4 × dp 2 each rank holds an eighth of every expert, and with
/// expert parallelism one whole expert of eight: the same bytes, where tp 4 alone holds a
/// quarter (Mixtral config: 32 layers of 8 experts, each 3 matrices of 4096 × 14336 in bf16).
#[test]
fn data_and_expert_parallel_ranks_hold_what_vllm_gives_them() {
    let model = builtin("mixtral-8x7b");
    let profile = hardware::load("h100-80gb-x8").expect("a profile");
    let mut replicated = serve(4, 1);
    replicated.vllm.data_parallel_size = Some(2);
    let mut spread = replicated.clone();
    spread.vllm.enable_expert_parallel = true;
    let dp = vllm_estimate(&model, &profile, &replicated).expect("an estimate");
    let ep = vllm_estimate(&model, &profile, &spread).expect("an estimate");
    assert_eq!((dp.devices.len(), ep.devices.len()), (8, 8));
    let experts: u64 = 32 * 8 * 3 * 4096 * 14336 * 2;
    assert_eq!(dp.devices[0].components.weights, ep.devices[0].components.weights);
    let alone = vllm_estimate(&model, &profile, &serve(4, 1)).expect("an estimate");
    assert_eq!(
        alone.devices[0].components.weights - dp.devices[0].components.weights,
        experts / 4 - experts / 8
    );
    assert!(dp.devices.iter().all(|d| d.components.weights == dp.devices[0].components.weights));
    let dense = builtin("llama-3.2-1b");
    let mut on_dense = serve(1, 1);
    on_dense.vllm.enable_expert_parallel = true;
    assert_eq!(
        vllm_estimate(&dense, &hardware::load("h100-80gb").expect("a profile"), &on_dense)
            .expect_err("dense")
            .origin,
        "--enable-expert-parallel"
    );
}

/// vLLM's tensor-parallel asserts, on Qwen2.5-14B's config (40 heads, 8 KV heads, MLP 13824):
/// 5 divides the heads but neither divides the 8 KV heads nor is a multiple of them
/// (`LlamaAttention`/`Qwen2Attention`: `total_num_kv_heads % tp_size == 0` or the converse);
/// 2, 4 and 8 pass; 16 does not divide the heads.
#[test]
fn tensor_parallel_sizes_vllm_refuses_are_refused() {
    use vramplan_sim::tensor_parallel::serving_tp_refusal;
    let qwen = builtin("qwen2.5-14b");
    assert!(serving_tp_refusal(&qwen, 5).is_some_and(|why| why.contains("8 KV heads")));
    for tp in [1, 2, 4, 8] {
        assert_eq!(serving_tp_refusal(&qwen, tp), None, "tp {tp}");
    }
    assert!(serving_tp_refusal(&qwen, 16).is_some_and(|why| why.contains("40 attention heads")));
    let profile = hardware::load("8xh100-80gb").expect("a profile");
    let mut five = serve(5, 1);
    five.seq = 4096;
    let err = vramplan_sim::input::validate(&five, &qwen, &profile).expect_err("tp 5");
    assert!(
        err.problem.contains("KV heads") && err.fix.as_deref().is_some_and(|f| f.contains("1, 2, 4, 8")),
        "{err}"
    );
}
