//! The static device-map check on hand-written maps of real models: each mismatch a runtime
//! would hit (experts apart from their router, tied embeddings apart, a decoder layer split,
//! entries overlapping across GPUs, a tensor on no device, a name listed twice) is found with the
//! modules and devices it concerns, and clean maps pass. Module names in the expectations are
//! transformers' own (4.x `block_sparse_moe.experts.E`, 5.x fused `mlp.experts`), written out
//! here rather than taken from the model description.

use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_sim::placement::Target;
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, Rule, check_device_map};

fn load(name: &str, naming: Naming) -> ModelDescription {
    model::load(name, ImportOptions { naming }).expect("built-in model")
}

fn gpu(i: u32) -> Target {
    Target::Gpu(i)
}

fn entries(list: &[(&str, Target)]) -> Vec<(String, Target)> {
    list.iter().map(|(k, t)| (k.to_string(), *t)).collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The one finding there must be, with its rule.
fn only(findings: &[Finding], rule: Rule) -> &Finding {
    assert_eq!(findings.len(), 1, "expected one {rule} finding, got {findings:#?}");
    assert_eq!(findings[0].rule, rule, "{findings:#?}");
    &findings[0]
}

/// A map accelerate could write for a Llama-style decoder of `layers` layers: embeddings, each
/// layer whole, the final norm and the head, the layers split in two halves over GPUs 0 and 1.
fn even_split(layers: usize) -> Vec<(String, Target)> {
    let mut map = vec![("model.embed_tokens".to_string(), gpu(0))];
    for i in 0..layers {
        map.push((format!("model.layers.{i}"), gpu(if i < layers / 2 { 0 } else { 1 })));
    }
    map.push(("model.norm".into(), gpu(1)));
    map.push(("lm_head".into(), gpu(1)));
    map
}

/// Mixtral 8x7B's layer 0 written module by module as transformers 4.x names it, experts 4-7
/// on GPU 1 with the rest of the model, everything else of layer 0 on GPU 0.
fn mixtral_v4_experts_split() -> Vec<(String, Target)> {
    let mut map = entries(&[
        ("model.embed_tokens", gpu(0)),
        ("model.layers.0.input_layernorm", gpu(0)),
        ("model.layers.0.self_attn", gpu(0)),
        ("model.layers.0.post_attention_layernorm", gpu(0)),
        ("model.layers.0.block_sparse_moe.gate", gpu(0)),
    ]);
    for e in 0..8 {
        map.push((format!("model.layers.0.block_sparse_moe.experts.{e}"), gpu(if e < 4 { 0 } else { 1 })));
    }
    // Mixtral 8x7B has 32 layers.
    for i in 1..32 {
        map.push((format!("model.layers.{i}"), gpu(1)));
    }
    map.push(("model.norm".into(), gpu(1)));
    map.push(("lm_head".into(), gpu(1)));
    map
}

#[test]
fn mixtral_experts_apart_from_their_router_under_accelerate_v4() {
    let model = load("mixtral-8x7b", Naming::V4);
    let findings = check_device_map(&model, &mixtral_v4_experts_split(), Runtime::AccelerateV4);
    let f = only(&findings, Rule::ExpertsApartFromRouter);
    assert_eq!(
        f.modules,
        strings(&[
            "model.layers.0.block_sparse_moe.gate",
            "model.layers.0.block_sparse_moe.experts.4",
            "model.layers.0.block_sparse_moe.experts.5",
            "model.layers.0.block_sparse_moe.experts.6",
            "model.layers.0.block_sparse_moe.experts.7",
        ])
    );
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 1"]));
    for needle in
        ["routing_weights", "Expected all tensors to be on the same device", "cuda:1 and cuda:0", "Fix:"]
    {
        assert!(f.message.contains(needle), "`{needle}` in {}", f.message);
    }
}

#[test]
fn mixtral_experts_under_a_catch_all_entry_are_reported_once() {
    // `"": 0` with experts 6 and 7 of layer 3 on GPU 1: the experts finding says it all (its
    // fix also ends the overlap of the expert entries with `""`).
    let model = load("mixtral-8x7b", Naming::V4);
    let map = entries(&[
        ("", gpu(0)),
        ("model.layers.3.block_sparse_moe.experts.6", gpu(1)),
        ("model.layers.3.block_sparse_moe.experts.7", gpu(1)),
    ]);
    let findings = check_device_map(&model, &map, Runtime::AccelerateV4);
    let f = only(&findings, Rule::ExpertsApartFromRouter);
    assert_eq!(f.modules[0], "model.layers.3.block_sparse_moe.gate");
    assert_eq!(
        &f.modules[1..],
        &strings(&["model.layers.3.block_sparse_moe.experts.6", "model.layers.3.block_sparse_moe.experts.7"])
    );
}

#[test]
fn mixtral_fused_experts_apart_from_their_router_under_accelerate_5() {
    let model = load("mixtral-8x7b", Naming::V5);
    let mut map = even_split(32);
    // Layer 0 written part by part, its fused experts on GPU 1.
    map.retain(|(k, _)| k != "model.layers.0");
    map.extend(entries(&[
        ("model.layers.0.input_layernorm", gpu(0)),
        ("model.layers.0.self_attn", gpu(0)),
        ("model.layers.0.post_attention_layernorm", gpu(0)),
        ("model.layers.0.mlp.gate", gpu(0)),
        ("model.layers.0.mlp.experts", gpu(1)),
    ]));
    let findings = check_device_map(&model, &map, Runtime::Accelerate);
    let f = only(&findings, Rule::ExpertsApartFromRouter);
    assert_eq!(f.modules, strings(&["model.layers.0.mlp.gate", "model.layers.0.mlp.experts"]));
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 1"]));
    // Whole layers on either GPU are clean in both namings.
    assert!(check_device_map(&model, &even_split(32), Runtime::Accelerate).is_empty());
    let v4 = load("mixtral-8x7b", Naming::V4);
    assert!(check_device_map(&v4, &even_split(32), Runtime::AccelerateV4).is_empty());
}

#[test]
fn experts_apart_are_the_point_of_expert_parallel() {
    let model = load("mixtral-8x7b", Naming::V4);
    assert!(check_device_map(&model, &mixtral_v4_experts_split(), Runtime::ExpertParallel).is_empty());
    // A pipeline stage holds whole layers: the same map splits layer 0.
    let findings = check_device_map(&model, &mixtral_v4_experts_split(), Runtime::Pipeline);
    let f = only(&findings, Rule::SplitBlock);
    assert_eq!(f.modules[0], "model.layers.0");
}

#[test]
fn tied_embeddings_on_two_gpus() {
    // GPT-2 ties `lm_head.weight` to `transformer.wte.weight`.
    let model = load("gpt2", Naming::V5);
    let map = entries(&[("transformer", gpu(0)), ("lm_head", gpu(1))]);
    let f = only(&check_device_map(&model, &map, Runtime::Accelerate), Rule::TiedWeightsSplit).clone();
    assert_eq!(f.modules, strings(&["transformer.wte", "lm_head"]));
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 1"]));
    assert!(f.message.contains("Tied parameters are on different devices"), "{}", f.message);
    assert!(f.message.contains("`\"lm_head\": 0`"), "{}", f.message);
    // Gemma ties `lm_head.weight` to `model.embed_tokens.weight`. An offloaded head runs on the
    // main GPU with a streamed copy and the storage stays with the embedding on GPU 0: the
    // runtime completes (recorded, `llama-tied-head-on-cpu` in fixtures/reference/mismatches).
    let gemma = load("gemma-2b", Naming::V5);
    let map = entries(&[("model", gpu(0)), ("lm_head", Target::Cpu)]);
    assert!(check_device_map(&gemma, &map, Runtime::Accelerate).is_empty());
    // Pipelines copy tied layers to each stage (DeepSpeed's TiedLayerSpec).
    let map = entries(&[("transformer", gpu(0)), ("lm_head", gpu(1))]);
    assert!(check_device_map(&model, &map, Runtime::Pipeline).is_empty());
}

#[test]
fn split_inside_a_decoder_layer() {
    // Llama 3 8B (hidden 4096, intermediate 14336, 8 KV heads of 128): the MLP, 3·4096·14336 =
    // 176 M parameters, outweighs attention and norms, 2·4096² + 2·4096·1024 + 2·4096 = 42 M, so
    // the layer's home is the MLP's GPU and the attention side is what moves.
    let model = load("llama-3-8b", Naming::V5);
    let mut map = even_split(32);
    map.retain(|(k, _)| k != "model.layers.0");
    map.extend(entries(&[
        ("model.layers.0.input_layernorm", gpu(0)),
        ("model.layers.0.self_attn", gpu(0)),
        ("model.layers.0.post_attention_layernorm", gpu(0)),
        ("model.layers.0.mlp", gpu(1)),
    ]));
    let findings = check_device_map(&model, &map, Runtime::Accelerate);
    let f = only(&findings, Rule::SplitBlock);
    assert_eq!(
        f.modules,
        strings(&[
            "model.layers.0",
            "model.layers.0.self_attn",
            "model.layers.0.input_layernorm",
            "model.layers.0.post_attention_layernorm",
        ])
    );
    assert_eq!(f.devices, strings(&["GPU 1", "GPU 0"]));
    assert!(
        f.message.contains("LlamaDecoderLayer") && f.message.contains("_no_split_modules"),
        "{}",
        f.message
    );
    // llama.cpp copies between devices itself: no mismatch there.
    assert!(check_device_map(&model, &map, Runtime::LlamaCpp).is_empty());
    // A pipeline cannot cut inside a layer either.
    assert_eq!(
        only(&check_device_map(&model, &map, Runtime::Pipeline), Rule::SplitBlock).modules[0],
        "model.layers.0"
    );
}

#[test]
fn offloaded_parts_run_on_the_first_gpu() {
    // accelerate runs modules offloaded to the CPU on the map's first GPU: half a layer on the
    // CPU beside GPU 0 is no mismatch, beside GPU 1 it is.
    let model = load("llama-3-8b", Naming::V5);
    let with = |device: Target| {
        let mut map = even_split(32);
        map.retain(|(k, _)| k != "model.layers.20");
        map.extend(entries(&[
            ("model.layers.20.input_layernorm", device),
            ("model.layers.20.self_attn", device),
            ("model.layers.20.post_attention_layernorm", device),
            ("model.layers.20.mlp", Target::Cpu),
        ]));
        map
    };
    assert!(check_device_map(&model, &with(gpu(0)), Runtime::Accelerate).is_empty());
    let findings = check_device_map(&model, &with(gpu(1)), Runtime::Accelerate);
    let f = only(&findings, Rule::SplitBlock);
    // The CPU part runs on GPU 0 and is the larger: the GPU 1 side moves.
    assert_eq!(f.modules[..2], strings(&["model.layers.20", "model.layers.20.self_attn"]));
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 1"]));
}

#[test]
fn entry_inside_another_on_another_gpu() {
    // accelerate hooks every submodule of `""` to GPU 0 before it reads `model.layers.20`, so
    // the layer's weights load to GPU 1 while its projections move their inputs to GPU 0.
    let model = load("llama-3-8b", Naming::V5);
    let map = entries(&[("", gpu(0)), ("model.layers.20", gpu(1))]);
    let f = only(&check_device_map(&model, &map, Runtime::Accelerate), Rule::OverlappingEntries).clone();
    assert_eq!(f.modules, strings(&["model.layers.20", ""]));
    assert_eq!(f.devices, strings(&["GPU 1", "GPU 0"]));
    assert!(f.message.contains("`model.layers.20.self_attn.q_proj`"), "{}", f.message);
    assert!(f.message.contains("`model.embed_tokens`"), "the disjoint entries: {}", f.message);
    // A leaf module gets a hook of its own: `lm_head` on GPU 1 under `""` is fine.
    let map = entries(&[("", gpu(0)), ("lm_head", gpu(1))]);
    assert!(check_device_map(&model, &map, Runtime::Accelerate).is_empty());
    // Pipelines read the longest name and hook nothing.
    let map = entries(&[("", gpu(0)), ("model.layers.20", gpu(1))]);
    assert!(check_device_map(&model, &map, Runtime::Pipeline).is_empty());
}

#[test]
fn parameters_on_no_device() {
    let model = load("llama-3-8b", Naming::V5);
    let mut map = even_split(32);
    map.retain(|(k, _)| k != "lm_head");
    for runtime in Runtime::ALL {
        let findings = check_device_map(&model, &map, runtime);
        let f = only(&findings, Rule::Uncovered);
        assert_eq!(f.modules, strings(&["lm_head"]), "{runtime:?}");
        assert!(f.message.contains("does not give any device for the following parameters: lm_head.weight"));
        // The head goes after the final norm, on GPU 1.
        assert!(f.message.contains("`\"lm_head\": 1`"), "{}", f.message);
    }
    // GPT-2's head is tied to the token embedding: it belongs with `transformer.wte`.
    let gpt2 = load("gpt2", Naming::V5);
    let map = entries(&[
        ("transformer.wte", gpu(0)),
        ("transformer.wpe", gpu(0)),
        ("transformer.h", gpu(1)),
        ("transformer.ln_f", gpu(1)),
    ]);
    let f = only(&check_device_map(&gpt2, &map, Runtime::Accelerate), Rule::Uncovered).clone();
    assert_eq!(f.modules, strings(&["lm_head"]));
    assert!(f.message.contains("`\"lm_head\": 0`"), "{}", f.message);
}

#[test]
fn name_listed_twice() {
    let model = load("llama-3-8b", Naming::V5);
    let mut map = even_split(32);
    map.push(("model.layers.3".into(), gpu(1)));
    let findings = check_device_map(&model, &map, Runtime::Accelerate);
    // json.load keeps the last: layer 3 lands on GPU 1, inside the first half, which is no
    // mismatch for accelerate (whole layers) but is the duplicate.
    let f = only(&findings, Rule::ListedTwice);
    assert_eq!(f.modules, strings(&["model.layers.3"]));
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 1"]));
    assert!(f.message.contains("on GPU 1 and silently ignores"), "{}", f.message);
    // The same device twice is reported too: an edit to one of them would be lost.
    let map = entries(&[("", gpu(0)), ("lm_head", gpu(0)), ("lm_head", gpu(0))]);
    let f = only(&check_device_map(&model, &map, Runtime::Accelerate), Rule::ListedTwice).clone();
    assert_eq!(f.devices, strings(&["GPU 0", "GPU 0"]));
}

#[test]
fn clean_maps_pass() {
    for (name, naming) in [("llama-3-8b", Naming::V5), ("mixtral-8x7b", Naming::V4), ("gpt2", Naming::V5)] {
        let model = load(name, naming);
        for runtime in Runtime::ALL {
            let findings = check_device_map(&model, &entries(&[("", gpu(0))]), runtime);
            assert!(findings.is_empty(), "{name} {runtime:?}: {findings:#?}");
        }
    }
    let model = load("llama-3-8b", Naming::V5);
    for runtime in Runtime::ALL {
        assert!(check_device_map(&model, &even_split(32), runtime).is_empty(), "{runtime:?}");
    }
    // Offloading whole layers to the CPU and disk is clean.
    let mut map = even_split(32);
    for (k, t) in &mut map {
        if k.starts_with("model.layers.3") {
            *t = Target::Cpu;
        } else if k == "lm_head" {
            *t = Target::Disk;
        }
    }
    assert!(check_device_map(&model, &map, Runtime::Accelerate).is_empty());
}
