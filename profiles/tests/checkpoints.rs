//! Model folders: real index files of public checkpoints (`fixtures/published/models`), whose
//! `metadata.total_size` the description's bytes must reproduce, and synthetic safetensors files
//! written here (quantized checkpoints with a config, broken files) whose sizes the tests work
//! out by hand from the layouts.

mod support;

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use support::{element_bytes, write_safetensors};
use vramplan_profiles::model::safetensors::load_folder;
use vramplan_profiles::model::{ImportOptions, ModelDescription, Naming, TensorKind};
use vramplan_profiles::{DType, InputError, Location};

fn shared(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/published/models").join(model)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write_raw(path: &Path, bytes: &[u8]) {
    File::create(path).unwrap().write_all(bytes).unwrap();
}

/// Every real index: the tree (in the checkpoint's naming) has every `weight_map` name, and its
/// bytes equal `metadata.total_size` except for tree tensors the checkpoint does not store,
/// which must be rotary `inv_freq` buffers (and in 5.x naming their `original_inv_freq` copies)
/// of `head_dim / 2` fp32 values each, or 5.x Gemma's non-persistent `embed_scale` scalar
/// (`nn.Buffer(torch.tensor(hidden**0.5), persistent=False)` in `modeling_gemma.py`), one value at
/// the checkpoint's dtype.
#[test]
fn shared_checkpoints_match_their_index_total_size() {
    for name in [
        "meta-llama__Meta-Llama-3-8B",
        "mistralai__Mistral-7B-v0.1",
        "mistralai__Mixtral-8x7B-v0.1",
        "google__gemma-2b",
    ] {
        let folder = shared(name);
        let index = read_json(&folder.join("model.safetensors.index.json"));
        let config = read_json(&folder.join("config.json"));
        let total_size = index["metadata"]["total_size"].as_u64().unwrap();
        let weight_map: BTreeSet<String> = index["weight_map"].as_object().unwrap().keys().cloned().collect();
        let hidden = config["hidden_size"].as_u64().unwrap();
        let heads = config["num_attention_heads"].as_u64().unwrap();
        let head_dim = config.get("head_dim").and_then(Value::as_u64).unwrap_or(hidden / heads);

        let model = load_folder(&folder, ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tensors = model.tensors();
        let paths: BTreeSet<&str> = tensors.iter().map(|(p, _)| p.as_str()).collect();
        let unknown: Vec<&String> = weight_map.iter().filter(|n| !paths.contains(n.as_str())).collect();
        assert!(unknown.is_empty(), "{name}: checkpoint names missing from the tree: {unknown:?}");

        let not_stored: Vec<&str> = tensors
            .iter()
            .filter(|(p, t)| t.tied_to.is_none() && !weight_map.contains(p))
            .map(|(p, _)| p.as_str())
            .collect();
        let mut expected = total_size;
        for path in &not_stored {
            if path.ends_with("rotary_emb.inv_freq") || path.ends_with("rotary_emb.original_inv_freq") {
                expected += head_dim / 2 * 4;
            } else if *path == "model.embed_tokens.embed_scale" {
                // bf16 / fp16 checkpoints: a two-byte scalar.
                assert!(name.starts_with("google__gemma"), "{name}: unexpected `{path}`");
                expected += 2;
            } else {
                panic!("{name}: `{path}` is in the tree but not the checkpoint");
            }
        }
        assert_eq!(
            model.bytes(),
            expected,
            "{name}: total_size {total_size} + {} buffers not stored",
            not_stored.len()
        );
    }
}

#[test]
fn mixtral_checkpoint_is_read_in_transformers_4_naming() {
    let model = load_folder(&shared("mistralai__Mixtral-8x7B-v0.1"), ImportOptions::default()).unwrap();
    assert_eq!(model.naming, Naming::V4);
    assert!(model.root.tensor("model.layers.31.block_sparse_moe.experts.7.w3.weight").is_some());
    assert!(model.notes.iter().any(|n| n.contains("4.x")), "{:?}", model.notes);
    // Published: 46.7B parameters.
    let billions = model.params() as f64 / 1e9;
    assert!((billions - 46.7).abs() < 0.05, "{billions}");
}

/// A tiny Llama config: hidden 64, 2 layers, 4 heads of 16, 2 key/value heads, MLP 128,
/// vocabulary 100.
fn tiny_llama_config(extra: Value) -> Value {
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "torch_dtype": "float16"
    });
    if let (Value::Object(c), Value::Object(e)) = (&mut config, extra) {
        c.extend(e);
    }
    config
}

/// The tiny Llama's linear layers per block: (name, in, out).
const TINY_LINEARS: [(&str, u64, u64); 7] = [
    ("self_attn.q_proj", 64, 64),
    ("self_attn.k_proj", 64, 32),
    ("self_attn.v_proj", 64, 32),
    ("self_attn.o_proj", 64, 64),
    ("mlp.gate_proj", 64, 128),
    ("mlp.up_proj", 64, 128),
    ("mlp.down_proj", 128, 64),
];

/// Parameters of the tiny Llama, by hand: embeddings and head 100×64 each, final norm 64, and
/// per block the seven projections plus two norms.
const TINY_PARAMS: u64 = 2 * 100 * 64 + 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64);

/// The tiny Llama's rotary buffers in 5.x naming: `inv_freq` and `original_inv_freq`, head_dim / 2
/// fp32 values each.
const TINY_INV_FREQ_BYTES: u64 = 2 * 16 / 2 * 4;

fn tiny_unquantized(dtype: &'static str) -> Vec<(String, &'static str, Vec<u64>)> {
    let mut tensors = vec![
        ("model.embed_tokens.weight".to_string(), dtype, vec![100, 64]),
        ("model.norm.weight".to_string(), dtype, vec![64]),
        ("lm_head.weight".to_string(), dtype, vec![100, 64]),
    ];
    for layer in 0..2 {
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            tensors.push((format!("model.layers.{layer}.{norm}.weight"), dtype, vec![64]));
        }
    }
    tensors
}

fn write_folder(dir: &Path, config: &Value, tensors: &[(String, &str, Vec<u64>)]) -> u64 {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors)
}

fn no_disagreements(model: &ModelDescription) {
    for note in &model.notes {
        assert!(
            !note.contains("have no place") && !note.contains("are not in the checkpoint"),
            "unexpected disagreement: {note}"
        );
    }
}

/// GPTQ 4-bit, group 32: `qweight [in/8, out]` I32, `qzeros [in/32, out/8]` I32,
/// `scales [in/32, out]` F16, `g_idx [in]` I32 in place of each projection's weight.
fn gptq_tensors() -> Vec<(String, &'static str, Vec<u64>)> {
    let mut tensors = tiny_unquantized("F16");
    for layer in 0..2 {
        for (name, inp, out) in TINY_LINEARS {
            let p = format!("model.layers.{layer}.{name}");
            tensors.push((format!("{p}.qweight"), "I32", vec![inp / 8, out]));
            tensors.push((format!("{p}.qzeros"), "I32", vec![inp / 32, out / 8]));
            tensors.push((format!("{p}.scales"), "F16", vec![inp / 32, out]));
            tensors.push((format!("{p}.g_idx"), "I32", vec![inp]));
        }
    }
    tensors
}

fn gptq_config() -> Value {
    tiny_llama_config(json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}))
}

#[test]
fn gptq_checkpoint_packs_eight_values_per_int32() {
    let dir = tempfile::tempdir().unwrap();
    let stored = write_folder(dir.path(), &gptq_config(), &gptq_tensors());
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    assert_eq!(model.params(), TINY_PARAMS);
    assert_eq!(model.bytes(), stored + TINY_INV_FREQ_BYTES);
    let q = model.root.find("model.layers.1.self_attn.q_proj").unwrap();
    let names: Vec<&str> = q.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(!names.contains(&"weight"), "{names:?}");
    let qweight = q.tensors.iter().find(|t| t.name == "qweight").unwrap();
    assert_eq!(qweight.kind, TensorKind::PackedParameter { per_element: 8 });
    assert_eq!(qweight.shape, [8, 64]);
    assert!(q.tensors.iter().filter(|t| t.name != "qweight").all(|t| t.kind == TensorKind::QuantConstant));
    no_disagreements(&model);
}

#[test]
fn gptq_index_without_shards_gets_sizes_from_the_quantization_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), gptq_config().to_string()).unwrap();
    let tensors = gptq_tensors();
    let total: u64 = tensors.iter().map(|(_, d, s)| s.iter().product::<u64>() * element_bytes(d)).sum();
    let weight_map: serde_json::Map<String, Value> =
        tensors.iter().map(|(n, _, _)| (n.clone(), json!("model-00001-of-00001.safetensors"))).collect();
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    assert_eq!(model.params(), TINY_PARAMS);
    assert_eq!(model.bytes(), total + TINY_INV_FREQ_BYTES);
    no_disagreements(&model);
}

/// Block fp8 (DeepSeek-V3 style) with 32×32 blocks: F8_E4M3 weights and F32
/// `weight_scale_inv [⌈out/32⌉, ⌈in/32⌉]`; embeddings, norms and head stay BF16.
#[test]
fn fp8_checkpoint_keeps_fp8_weights_and_their_block_scales() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_llama_config(json!({
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [32, 32]}
    }));
    let mut tensors = tiny_unquantized("BF16");
    for layer in 0..2 {
        for (name, inp, out) in TINY_LINEARS {
            let p = format!("model.layers.{layer}.{name}");
            tensors.push((format!("{p}.weight"), "F8_E4M3", vec![out, inp]));
            tensors.push((format!("{p}.weight_scale_inv"), "F32", vec![out.div_ceil(32), inp.div_ceil(32)]));
        }
    }
    let stored = write_folder(dir.path(), &config, &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    assert_eq!(model.params(), TINY_PARAMS);
    assert_eq!(model.bytes(), stored + TINY_INV_FREQ_BYTES);
    let weight = model.root.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!((weight.dtype, weight.kind), (DType::F8E4M3, TensorKind::Parameter));
    assert_eq!(model.root.tensor("model.norm.weight").unwrap().dtype, DType::BF16);
    // 7 projections × 2 layers hold 2 × (4096 + 2·2048 + 4096 + 3·8192) fp8 parameters, more than
    // the 12 864 bf16 ones: the checkpoint's dtype is fp8.
    assert_eq!(model.dtype, DType::F8E4M3);
    no_disagreements(&model);
}

/// bitsandbytes nf4: each weight stored as U8 `[out·in/2, 1]` with its quantization state.
#[test]
fn bitsandbytes_4bit_weights_count_two_values_per_byte() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_llama_config(
        json!({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true}}),
    );
    let mut tensors = tiny_unquantized("F16");
    for layer in 0..2 {
        for (name, inp, out) in TINY_LINEARS {
            let p = format!("model.layers.{layer}.{name}");
            let numel = inp * out;
            tensors.push((format!("{p}.weight"), "U8", vec![numel / 2, 1]));
            tensors.push((format!("{p}.weight.absmax"), "U8", vec![numel / 64]));
            tensors.push((format!("{p}.weight.quant_map"), "F32", vec![16]));
            tensors.push((format!("{p}.weight.nested_absmax"), "F32", vec![1]));
            tensors.push((format!("{p}.weight.nested_quant_map"), "F32", vec![256]));
            tensors.push((format!("{p}.weight.quant_state.bitsandbytes__nf4"), "U8", vec![120]));
        }
    }
    let stored = write_folder(dir.path(), &config, &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    assert_eq!(model.params(), TINY_PARAMS);
    assert_eq!(model.bytes(), stored + TINY_INV_FREQ_BYTES);
    let weight = model.root.find("model.layers.0.mlp.up_proj").unwrap();
    assert_eq!(weight.tensors.len(), 6);
    assert_eq!(weight.tensors[0].kind, TensorKind::PackedParameter { per_element: 2 });
    no_disagreements(&model);
}

#[test]
fn names_on_only_one_side_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = tiny_unquantized("F16");
    for layer in 0..2 {
        for (name, inp, out) in TINY_LINEARS {
            tensors.push((format!("model.layers.{layer}.{name}.weight"), "F16", vec![out, inp]));
        }
        tensors.push((format!("model.layers.{layer}.self_attn.rotary_emb.inv_freq"), "F32", vec![8]));
    }
    tensors.retain(|(n, _, _)| n != "lm_head.weight");
    write_folder(dir.path(), &tiny_llama_config(json!({})), &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    let notes = model.notes.join("\n");
    assert!(
        notes.contains("2 checkpoint tensors have no place") && notes.contains("rotary_emb.inv_freq` ×2"),
        "{notes}"
    );
    assert!(
        notes.contains("1 tensors of the tree config.json builds are not in the checkpoint")
            && notes.contains("`lm_head.weight`"),
        "{notes}"
    );
}

#[test]
fn a_checkpoint_without_config_gives_a_tree_from_its_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = vec![("transformer.wte.weight".to_string(), "F32", vec![50, 32])];
    for layer in 0..3 {
        tensors.push((format!("transformer.h.{layer}.ln_1.weight"), "F32", vec![32]));
        tensors.push((format!("transformer.h.{layer}.ln_1.bias"), "F32", vec![32]));
        tensors.push((format!("transformer.h.{layer}.mlp.c_fc.weight"), "F32", vec![32, 128]));
    }
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).unwrap();
    let blocks: Vec<&str> = model.facts.layers.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(blocks, ["transformer.h.0", "transformer.h.1", "transformer.h.2"]);
    assert_eq!(model.params(), 50 * 32 + 3 * (32 + 32 + 32 * 128));
    assert_eq!((model.facts.hidden_size, model.facts.vocab_size), (32, 50));
    assert!(
        model.notes.iter().any(|n| n.contains("no config.json") && n.contains("missing")),
        "{:?}",
        model.notes
    );
}

/// Loads a folder holding just `bytes` as `model.safetensors`, expecting an error about it.
fn broken(bytes: &[u8]) -> (InputError, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    write_raw(&file, bytes);
    let err = load_folder(dir.path(), ImportOptions::default()).unwrap_err();
    assert_eq!(err.origin, file.display().to_string(), "the error names the file: {err}");
    (err.clone(), err.to_string())
}

fn with_header(json: &str, data: usize) -> Vec<u8> {
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data));
    bytes
}

#[test]
fn a_header_that_lies_about_its_length_is_refused() {
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"a\": 1}  ");
    let (_, text) = broken(&bytes);
    assert!(text.contains("header says 1000 bytes but the file has only 10"), "{text}");
}

#[test]
fn an_absurd_header_length_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let mut f = File::create(&file).unwrap();
    f.write_all(&200_000_000u64.to_le_bytes()).unwrap();
    f.set_len(300_000_000).unwrap(); // sparse: costs no disk
    let text = load_folder(dir.path(), ImportOptions::default()).unwrap_err().to_string();
    assert!(text.contains("200000000") && text.contains("100000000"), "{text}");
}

#[test]
fn truncated_files_are_refused() {
    let (_, text) = broken(&[1, 2, 3]);
    assert!(text.contains("too short"), "{text}");
    let header = r#"{"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}"#;
    let (err, text) = broken(&with_header(header, 40));
    assert!(text.contains("truncated") && text.contains("only 40 bytes of data"), "{text}");
    assert_eq!(err.location, Some(Location::Key("w".into())));
}

#[test]
fn invalid_header_json_is_located() {
    let (err, text) = broken(&with_header("{\"w\": {\"dtype\": \"F32\",, }}", 0));
    assert!(text.contains("malformed JSON"), "{text}");
    assert!(matches!(err.location, Some(Location::LineColumn { line: 1, .. })), "{text}");
}

#[test]
fn unknown_dtypes_and_inconsistent_offsets_are_refused() {
    let (err, text) = broken(&with_header(r#"{"w":{"dtype":"C128","shape":[2],"data_offsets":[0,32]}}"#, 32));
    assert!(text.contains("unknown dtype `C128`"), "{text}");
    assert_eq!(err.location, Some(Location::Key("w".into())));
    let (_, text) = broken(&with_header(r#"{"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}}"#, 16));
    assert!(text.contains("hold 16 bytes") && text.contains("needs 18"), "{text}");
}

/// A header that lists a tensor twice is a corrupt file (the second entry would hide the
/// first's bytes): refused, naming the tensor, where JSON readers keep the last silently.
#[test]
fn a_header_listing_a_tensor_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut header = br#"{"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a.weight":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#.to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&[0u8; 24]);
    write_raw(&dir.path().join("model.safetensors"), &bytes);
    let err = load_folder(dir.path(), ImportOptions::default()).expect_err("a repeated tensor");
    assert!(err.problem.contains("`a.weight` twice"), "{err}");
}

/// Without a config, a block list's indices must run from 0: `layers.0` and `layers.5000` (or an
/// index past u64) is a checkpoint missing the blocks between, not a model of two blocks. A
/// projector's `Sequential(Linear, GELU, Linear)`, which names items 0 and 2, stays a model.
#[test]
fn a_block_list_with_missing_items_is_refused() {
    for far in ["5000", "100000000000000000000"] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            ("model.embed_tokens.weight".to_string(), "F16", vec![32, 8]),
            ("model.layers.0.mlp.weight".to_string(), "F16", vec![8, 8]),
            (format!("model.layers.{far}.mlp.weight"), "F16", vec![8, 8]),
        ];
        write_safetensors(&dir.path().join("model.safetensors"), &tensors);
        let err = load_folder(dir.path(), ImportOptions::default()).expect_err("missing blocks");
        assert!(
            err.problem.contains(&format!("`model.layers.{far}`")) && err.problem.contains("2 items"),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let tensors = vec![
        ("model.embed_tokens.weight".to_string(), "F16", vec![32, 8]),
        ("model.layers.0.mlp.weight".to_string(), "F16", vec![8, 8]),
        ("model.layers.1.mlp.weight".to_string(), "F16", vec![8, 8]),
        ("projector.0.weight".to_string(), "F16", vec![8, 8]),
        ("projector.2.weight".to_string(), "F16", vec![8, 8]),
    ];
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let model = load_folder(dir.path(), ImportOptions::default()).expect("a model");
    assert_eq!(model.facts.layers.len(), 2);
}
