//! `whatif max-concurrency` and `max-seq` under vLLM go through vLLM's budget with the serving
//! options it reserves memory for: multi-LoRA slots (`--max-loras`) take KV cache away, and
//! `--kv-cache-memory-bytes` sets it. Each answer is held to the budget's own KV tokens worked
//! out by hand (`sim/tests/vllm_extras.rs` holds the budget to vLLM's source).

use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::engines::vllm;
use vramplan_sim::workload::{Engine, Speculative, VllmOptions, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{EngineKind, Question, max_concurrency, max_seq};

/// KV bytes of one Llama-3.1-8B token in bf16 (32 layers × K and V × 8 heads × 128 × 2 B).
const KV_PER_TOKEN: u64 = 32 * 2 * 8 * 128 * 2;

fn vllm_sequences(workload: &Workload, seq: u64) -> (Option<u64>, Option<u64>) {
    let model = model::load("llama-3.1-8b-instruct", ImportOptions::default()).expect("a built-in model");
    let hw = hardware::load("h100-80gb").expect("a profile");
    let request = Request { headroom: 0.0, ..Request::new(Runtime::Accelerate) };
    let question = Question { model: &model, hardware: &hw, workload, request: &request };
    let answers = max_concurrency(&question, seq);
    let vllm = answers.iter().find(|a| a.engine == EngineKind::Vllm).expect("a vLLM answer");
    assert!(vllm.refused.is_none(), "{:?}", vllm.refused);
    (vllm.sequences, vllm.kv_capacity_tokens)
}

fn serving(options: VllmOptions) -> Workload {
    Workload { seq: 8192, engine: Engine::VLLM_DEFAULT, vllm: options, ..Workload::default() }
}

#[test]
fn max_concurrency_under_vllm_counts_the_lora_slots() {
    let (plain, plain_tokens) = vllm_sequences(&serving(VllmOptions::default()), 8192);
    let lora = VllmOptions { max_loras: 8, max_lora_rank: 64, ..VllmOptions::default() };
    let (served, lora_tokens) = vllm_sequences(&serving(lora), 8192);
    let (plain_tokens, lora_tokens) = (plain_tokens.expect("tokens"), lora_tokens.expect("tokens"));
    // 8 slots of rank 64 in bf16 over Llama-3.1-8B's 32 layers of Σ(in + out) = 81920:
    // 2.5 GiB of slots, 20480 fewer tokens of 128 KiB, give or take the punica metadata and the
    // shrink buffer (under a block of 16 tokens each).
    let slots = 8 * 64 * 32 * 81_920 * 2;
    let lost = plain_tokens - lora_tokens;
    assert!(lost >= slots / KV_PER_TOKEN && lost <= slots / KV_PER_TOKEN + 64, "{lost} tokens lost");
    assert_eq!(plain, Some(plain_tokens / 8192));
    assert_eq!(served, Some(lora_tokens / 8192));
    assert!(served < plain);
}

#[test]
fn max_concurrency_and_max_seq_under_vllm_follow_a_given_kv_cache() {
    // --kv-cache-memory-bytes 2 GiB: 1024 blocks of 16 tokens.
    let given = VllmOptions { kv_cache_memory_bytes: Some(2 << 30), ..VllmOptions::default() };
    let (sequences, tokens) = vllm_sequences(&serving(given.clone()), 4096);
    assert_eq!((sequences, tokens), (Some(4), Some(16_384)));

    let model = model::load("llama-3.1-8b-instruct", ImportOptions::default()).expect("a built-in model");
    let hw = hardware::load("h100-80gb").expect("a profile");
    let request = Request { headroom: 0.0, ..Request::new(Runtime::Accelerate) };
    for auto in [false, true] {
        let workload = serving(VllmOptions { max_model_len_auto: auto, ..given.clone() });
        let question = Question { model: &model, hardware: &hw, workload: &workload, request: &request };
        let longest = max_seq(&question, false).expect("max-seq");
        assert_eq!(longest.value, Some(16_384), "--max-model-len auto: {auto}");
        let budget = vllm::budget(&model, &hw.devices[0], &workload, 1).expect("budget");
        assert_eq!(budget.max_model_len_that_fits, 16_384);
    }
}

#[test]
fn max_concurrency_under_vllm_counts_a_draft_model() {
    let (plain, _) = vllm_sequences(&serving(VllmOptions::default()), 8192);
    let spec = Speculative {
        method: "draft_model".into(),
        num_speculative_tokens: 5,
        model: Some("llama-3.2-1b".into()),
    };
    let options = VllmOptions { speculative: Some(spec), ..VllmOptions::default() };
    let (drafted, tokens) = vllm_sequences(&serving(options.clone()), 8192);
    // The draft's 16 layers of KV (32 KiB a token) share every block with the model's 128 KiB.
    let model = model::load("llama-3.1-8b-instruct", ImportOptions::default()).expect("a built-in model");
    let hw = hardware::load("h100-80gb").expect("a profile");
    let budget = vllm::budget(&model, &hw.devices[0], &serving(options), 1).expect("budget");
    let per_token = KV_PER_TOKEN + 16 * 2 * 8 * 64 * 2;
    assert_eq!(tokens, Some(budget.kv_cache_bytes / (16 * per_token) * 16));
    assert_eq!(drafted, tokens.map(|t| t / 8192));
    assert!(drafted < plain);
}
