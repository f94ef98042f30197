//! Pre-quantized checkpoints read from their `quantization_config`: the bytes each method's
//! runtime module holds, against closed forms worked out here from each format (and, for
//! gpt-oss-20b, the published checkpoint's `metadata.total_size`); what transformers and vLLM
//! hold on GPUs of each generation; `--dtype` (a cast) changing only the unquantized parts; and
//! bad settings refused at their key.

mod support;

use serde_json::json;
use support::write_safetensors;
use vramplan_profiles::hardware::{self, ComputeCapability};
use vramplan_profiles::model::quantization::held::{Handling, Loader, handling, held_on};
use vramplan_profiles::model::safetensors::load_folder;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming, TensorKind};
use vramplan_profiles::{DType, InputError, Location};

fn builtin(name: &str, naming: Naming) -> ModelDescription {
    model::load(name, ImportOptions { naming }).unwrap_or_else(|e| panic!("{e}"))
}

fn import(config: &serde_json::Value) -> Result<ModelDescription, InputError> {
    model::hf::from_config_text(&config.to_string(), "config.json", ImportOptions::default())
}

fn capability(profile: &str) -> ComputeCapability {
    hardware::load(profile).unwrap_or_else(|e| panic!("{e}")).devices[0].compute_capability
}

/// Bytes of the tensors of `model` whose path contains `part`.
fn bytes_under(model: &ModelDescription, part: &str) -> u64 {
    model
        .tensors()
        .iter()
        .filter(|(p, t)| p.contains(part) && t.tied_to.is_none())
        .map(|(_, t)| t.bytes())
        .sum()
}

// gpt-oss-20b (openai/gpt-oss-20b config.json): hidden 2880, expert width 2880, 32 experts, 24
// layers, head_dim 64.
const OSS_HIDDEN: u64 = 2880;
const OSS_LAYERS: u64 = 24;
const OSS_EXPERTS: u64 = 32;
/// Routed-expert parameters: `gate_up_proj [E, H, 2I]` and `down_proj [E, I, H]` per layer.
const OSS_EXPERT_PARAMS: u64 = OSS_LAYERS * OSS_EXPERTS * 3 * OSS_HIDDEN * OSS_HIDDEN;
/// The rotary buffers transformers builds and no checkpoint stores: `inv_freq` and 5.x's
/// `original_inv_freq`, head_dim / 2 float32 values each.
const OSS_ROTARY_BYTES: u64 = 2 * 32 * 4;

#[test]
fn gpt_oss_20b_holds_its_experts_in_mxfp4_as_the_published_checkpoint_stores_them() {
    let model = builtin("gpt-oss-20b", Naming::V5);
    // MXFP4: two e2m1 values a byte and one e8m0 scale byte per 32 values.
    let mxfp4 = OSS_EXPERT_PARAMS / 2 + OSS_EXPERT_PARAMS / 32;
    let experts: u64 = (0..OSS_LAYERS)
        .map(|i| {
            bytes_under(&model, &format!("layers.{i}.mlp.experts.gate_up_proj_"))
                + bytes_under(&model, &format!("layers.{i}.mlp.experts.down_proj_"))
        })
        .sum();
    // The biases (`gate_up_proj_bias [E, 2I]`, `down_proj_bias [E, H]`) stay bf16.
    let biases = OSS_LAYERS * OSS_EXPERTS * 3 * OSS_HIDDEN * 2;
    assert_eq!(experts, mxfp4 + biases);
    // openai/gpt-oss-20b `model.safetensors.index.json`: `"total_size": 13761264768`.
    assert_eq!(model.bytes(), 13_761_264_768 + OSS_ROTARY_BYTES);
    assert_eq!(model.dtype, DType::BF16, "Mxfp4HfQuantizer.update_dtype: bf16 when no dtype is given");
    // The same parameters as the unquantized model (20.9B published).
    assert_eq!(model.params(), model.dequantized(DType::BF16).params());
    let blocks = model.root.tensor("model.layers.0.mlp.experts.down_proj_blocks").expect("blocks");
    assert_eq!((blocks.shape.as_slice(), blocks.dtype), (&[32, 2880, 90, 16][..], DType::U8));
    assert_eq!(blocks.kind, TensorKind::PackedParameter { per_element: 2 });
    let experts_module = model.root.find("model.layers.0.mlp.experts").expect("experts");
    assert_eq!(experts_module.class, "Mxfp4GptOssExperts");
}

#[test]
fn transformers_dequantizes_mxfp4_below_compute_capability_7_5_and_vllm_refuses_below_8_0() {
    let model = builtin("gpt-oss-20b", Naming::V5);
    let stored = model.bytes();
    let mxfp4 = OSS_EXPERT_PARAMS / 2 + OSS_EXPERT_PARAMS / 32;
    for profile in ["h100-80gb", "a100-80gb", "t4"] {
        // quantizer_mxfp4.py: `compute_capability >= (7, 5)` keeps MXFP4 (T4, A100, H100).
        let held = held_on(&model, Loader::Transformers, capability(profile), DType::BF16).unwrap();
        assert_eq!(held.handling, Handling::Kept, "{profile}");
        assert_eq!(held.model.bytes(), stored, "{profile}");
    }
    // A V100 (7.0): dequantized to bf16, two bytes per expert parameter.
    let v100 = capability("v100-32gb");
    let held = held_on(&model, Loader::Transformers, v100, DType::BF16).unwrap();
    assert_eq!(
        held.handling,
        Handling::Dequantized { to: DType::BF16, needs: Some(ComputeCapability { major: 7, minor: 5 }) }
    );
    assert_eq!(held.model.bytes(), stored - mxfp4 + 2 * OSS_EXPERT_PARAMS);
    let warning = held.warning(&model, Loader::Transformers, v100).expect("a warning");
    assert!(
        warning.contains("dequantizes the MXFP4 weights to bf16") && warning.contains("7.5"),
        "{warning}"
    );
    // vLLM: `Mxfp4Config.get_min_capability()` is 80.
    assert_eq!(
        held_on(&model, Loader::Vllm, capability("a100-80gb"), DType::BF16).unwrap().handling,
        Handling::Kept
    );
    let refused = held_on(&model, Loader::Vllm, capability("t4"), DType::BF16).unwrap_err();
    assert_eq!(refused.origin, "--hardware");
    assert!(refused.problem.contains("8.0"), "{refused}");
}

#[test]
fn dtype_sets_only_the_unquantized_parts() {
    let model = builtin("gpt-oss-20b", Naming::V5);
    let fp32 = model.cast(DType::F32);
    // Everything but the routed experts' blocks and scales doubles; those keep their bytes.
    let mxfp4 = OSS_EXPERT_PARAMS / 2 + OSS_EXPERT_PARAMS / 32;
    let unquantized = model.bytes() - mxfp4 - OSS_ROTARY_BYTES;
    assert_eq!(fp32.bytes(), mxfp4 + 2 * unquantized + OSS_ROTARY_BYTES);

    // DeepSeek-V3 (fp8, 128×128 blocks): the unquantized parameters are the embedding and head
    // (129280 × 7168 each), the norms (input, post-attention, q_a, kv_a per layer; the final one)
    // and the 58 routers (256 × 7168).
    let deepseek = builtin("deepseek-v3", Naming::V5);
    let (hidden, layers) = (7168u64, 61u64);
    let floats = 2 * 129_280 * hidden + layers * (2 * hidden + 1536 + 512) + hidden + 58 * 256 * hidden;
    assert_eq!(deepseek.cast(DType::F16).bytes(), deepseek.bytes(), "fp16 and bf16 are both 2 bytes");
    assert_eq!(deepseek.cast(DType::F32).bytes() - deepseek.bytes(), 2 * floats);
    // Every other parameter is an fp8 byte.
    let fp8: u64 =
        deepseek.tensors().iter().filter(|(_, t)| t.dtype == DType::F8E4M3).map(|(_, t)| t.numel()).sum();
    assert_eq!(fp8, deepseek.params() - floats);
}

#[test]
fn fp8_is_kept_from_8_9_dequantized_by_transformers_5_and_refused_by_4_below() {
    let v5 = builtin("deepseek-v3", Naming::V5);
    let h100 = capability("h100-80gb");
    let a100 = capability("a100-80gb");
    assert_eq!(handling(&v5, Loader::Transformers, h100, DType::BF16), Handling::Kept);
    assert_eq!(handling(&v5, Loader::Transformers, capability("l40s"), DType::BF16), Handling::Kept);
    let held = held_on(&v5, Loader::Transformers, a100, DType::BF16).unwrap();
    // Dequantized on an A100: every parameter in bf16, plus the fp32 buffers (the routers'
    // `e_score_correction_bias`, 58 × 256, and the two rotary buffers of 32 values).
    let buffers = 58 * 256 * 4 + 2 * 32 * 4;
    assert_eq!(held.model.bytes(), 2 * v5.params() + buffers);
    // transformers 4.57 raises instead; vLLM 0.19 keeps fp8 from 7.5 (FP8 Marlin, weight-only, below 8.9).
    let v4 = builtin("deepseek-v3", Naming::V4);
    let refused = held_on(&v4, Loader::Transformers, a100, DType::BF16).unwrap_err();
    assert!(refused.fix.as_deref().is_some_and(|f| f.contains("--naming v5")), "{refused}");
    assert_eq!(handling(&v5, Loader::Vllm, a100, DType::BF16), Handling::Kept);
    assert!(held_on(&v5, Loader::Vllm, capability("v100-32gb"), DType::BF16).is_err());
}

/// Llama-2-7B's shape with `extra` keys (`torch_dtype` float16, 32 layers).
fn llama_2_7b(extra: serde_json::Value) -> serde_json::Value {
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "vocab_size": 32000, "torch_dtype": "float16", "max_position_embeddings": 4096
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

/// Llama-2-7B's linear layers in one block, `(out, in)`.
const LLAMA_LINEARS: [(u64, u64); 7] =
    [(4096, 4096), (4096, 4096), (4096, 4096), (4096, 4096), (11008, 4096), (11008, 4096), (4096, 11008)];

/// Bytes of Llama-2-7B outside the block linears: fp16 embedding, head and norms, and the fp32
/// rotary buffers (64 values, twice in 5.x).
const LLAMA_REST: u64 = 2 * (2 * 32000 * 4096 + 32 * 2 * 4096 + 4096) + 2 * 64 * 4;

fn linears_bytes(per_linear: impl Fn(u64, u64) -> u64) -> u64 {
    32 * LLAMA_LINEARS.iter().map(|&(out, inp)| per_linear(out, inp)).sum::<u64>()
}

#[test]
fn gptq_awq_bitsandbytes_and_compressed_tensors_hold_their_packed_layouts() {
    // GPTQ 4-bit, group 128 (auto-gptq QuantLinear): qweight in·out/2, qzeros groups·out/2,
    // fp16 scales 2·groups·out, int32 g_idx 4·in.
    let gptq = import(&llama_2_7b(json!({"quantization_config":
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false}})))
    .unwrap();
    let expected = linears_bytes(|out, inp| {
        let groups = inp / 128;
        inp * out / 2 + groups * out / 2 + 2 * groups * out + 4 * inp
    });
    assert_eq!(gptq.bytes(), expected + LLAMA_REST);
    assert_eq!(gptq.params(), import(&llama_2_7b(json!({}))).unwrap().params());

    // AWQ 4-bit, group 128 (WQLinear_GEMM): no g_idx.
    let awq = import(&llama_2_7b(json!({"quantization_config":
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}})))
    .unwrap();
    let expected = linears_bytes(|out, inp| inp * out / 2 + (inp / 128) * out / 2 + 2 * (inp / 128) * out);
    assert_eq!(awq.bytes(), expected + LLAMA_REST);

    // bitsandbytes nf4 with double quantization: a byte per two values, a uint8 absmax per
    // 64-value block, an fp32 absmax per 256 blocks, the 16- and 256-entry fp32 codes.
    let nf4 = import(&llama_2_7b(json!({"quantization_config": {"quant_method": "bitsandbytes",
        "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true}})))
    .unwrap();
    let expected = linears_bytes(|out, inp| {
        let blocks = (out * inp).div_ceil(64);
        out * inp / 2 + blocks + 4 * 16 + 4 * blocks.div_ceil(256) + 4 * 256
    });
    // The head stays fp16 (`get_keys_to_not_convert`).
    assert_eq!(nf4.bytes(), expected + LLAMA_REST);
    // LLM.int8(): an int8 weight and an fp32 scale per row.
    let int8 = import(&llama_2_7b(json!({"quantization_config":
        {"quant_method": "bitsandbytes", "load_in_8bit": true}})))
    .unwrap();
    assert_eq!(int8.bytes(), linears_bytes(|out, inp| out * inp + 4 * out) + LLAMA_REST);

    // compressed-tensors W4A16 (llm-compressor's preset): int32 words of 8 values, an fp16
    // scale per 128 inputs and row (the model's dtype), an int64 `weight_shape`.
    let w4a16 = import(&llama_2_7b(json!({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "weights":
            {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}}})))
    .unwrap();
    assert_eq!(
        w4a16.bytes(),
        linears_bytes(|out, inp| out * inp / 2 + 2 * out * (inp / 128) + 16) + LLAMA_REST
    );
    // FP8-dynamic: fp8 weights, an fp16 scale per row.
    let fp8 = import(&llama_2_7b(json!({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true},
            "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel"}}}}})))
    .unwrap();
    assert_eq!(fp8.bytes(), linears_bytes(|out, inp| out * inp + 2 * out) + LLAMA_REST);

    // Dequantized, each is the unquantized model again.
    let plain = import(&llama_2_7b(json!({}))).unwrap();
    for quantized in [&gptq, &awq, &nf4, &int8, &w4a16, &fp8] {
        let back = quantized.dequantized(DType::F16);
        assert_eq!(back.bytes(), plain.bytes());
        assert_eq!(back.tensors().len(), plain.tensors().len());
    }
}

#[test]
fn quantizers_set_their_load_dtype_when_the_config_gives_none() {
    let config = llama_2_7b(json!({"torch_dtype": null, "quantization_config":
        {"quant_method": "gptq", "bits": 4, "group_size": 128}}));
    // `GptqHfQuantizer.update_dtype`: float16 when no dtype is given.
    assert_eq!(import(&config).unwrap().dtype, DType::F16);
}

#[test]
fn bad_quantization_settings_are_refused_at_their_key() {
    let cases = [
        (json!("fp8"), "quantization_config"),
        (json!({"bits": 4}), "quantization_config.quant_method"),
        (json!({"quant_method": "gptq", "bits": 5}), "quantization_config.bits"),
        (json!({"quant_method": "gptq", "bits": 4, "group_size": 0}), "quantization_config.group_size"),
        (json!({"quant_method": "bitsandbytes", "load_in_4bit": false}), "quantization_config.load_in_4bit"),
        (
            json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "int4"}),
            "quantization_config.bnb_4bit_quant_type",
        ),
        (json!({"quant_method": "fp8", "weight_block_size": [128]}), "quantization_config.weight_block_size"),
        (
            json!({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"}),
            "quantization_config.modules_to_not_convert",
        ),
        (
            json!({"quant_method": "compressed-tensors", "format": "pack-quantized"}),
            "quantization_config.config_groups",
        ),
        (
            json!({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups":
                {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group"}}}}),
            "quantization_config.config_groups.group_0.weights.group_size",
        ),
    ];
    for (settings, key) in cases {
        let err = import(&llama_2_7b(json!({ "quantization_config": settings.clone() }))).unwrap_err();
        assert_eq!(err.location, Some(Location::Key(key.to_string())), "{settings}: {err}");
        assert!(err.fix.is_some(), "{settings}: {err}");
    }
}

#[test]
fn an_mxfp4_checkpoint_folder_reads_its_blocks_and_scales_from_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (h, i, e, vocab) = (64u64, 64u64, 4u64, 128u64);
    let config = json!({
        "architectures": ["GptOssForCausalLM"], "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": e, "num_experts_per_tok": 2, "vocab_size": vocab, "torch_dtype": "bfloat16",
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
            ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![vocab, h]),
        ("lm_head.weight".into(), "BF16", vec![vocab, h]),
    ];
    tensors.push(("model.norm.weight".into(), "BF16", vec![h]));
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![64, h]),
            ("self_attn.q_proj.bias", vec![64]),
            ("self_attn.k_proj.weight", vec![32, h]),
            ("self_attn.k_proj.bias", vec![32]),
            ("self_attn.v_proj.weight", vec![32, h]),
            ("self_attn.v_proj.bias", vec![32]),
            ("self_attn.o_proj.weight", vec![h, 64]),
            ("self_attn.o_proj.bias", vec![h]),
            ("self_attn.sinks", vec![4]),
            ("mlp.router.weight", vec![e, h]),
            ("mlp.router.bias", vec![e]),
            ("mlp.experts.gate_up_proj_bias", vec![e, 2 * i]),
            ("mlp.experts.down_proj_bias", vec![e, h]),
        ] {
            tensors.push((format!("{p}.{name}"), "BF16", shape));
        }
        // gate_up_proj [E, H, 2I] stored transposed in 32-value blocks: [E, 2I, H/32, 16].
        tensors.push((format!("{p}.mlp.experts.gate_up_proj_blocks"), "U8", vec![e, 2 * i, h / 32, 16]));
        tensors.push((format!("{p}.mlp.experts.gate_up_proj_scales"), "U8", vec![e, 2 * i, h / 32]));
        tensors.push((format!("{p}.mlp.experts.down_proj_blocks"), "U8", vec![e, h, i / 32, 16]));
        tensors.push((format!("{p}.mlp.experts.down_proj_scales"), "U8", vec![e, h, i / 32]));
    }
    let stored = write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    assert_eq!(model.bytes(), stored + model.root.buffer_bytes());
    for note in &model.notes {
        assert!(!note.contains("no place") && !note.contains("not in the checkpoint"), "{note}");
    }
    assert!(model.quantization.is_some());
    let back = model.dequantized(DType::BF16);
    let gate_up = back.root.tensor("model.layers.1.mlp.experts.gate_up_proj").expect("dequantized");
    assert_eq!(gate_up.shape, [e, h, 2 * i]);
    assert_eq!(back.params(), model.params());
}
