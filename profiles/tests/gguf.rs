//! GGUF files as models, against the `gguf` Python package (llama.cpp's gguf-py) that wrote
//! them: `fixtures/reference/gguf/` holds tiny files written by `scripts/reference/gguf_files.py`
//! (real tensor types: Q4_K, Q6_K, Q8_0, F16, F32; a MoE file; a file split in three; a CLIP
//! projector) and `expected.json`, what `gguf.GGUFReader` reports of each: every tensor's name,
//! ggml dimensions, type and bytes, and gguf's table of block sizes.

use serde_json::Value;
use std::path::{Path, PathBuf};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, ModuleKind};
use vramplan_profiles::{DType, GgmlType};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/gguf")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("valid JSON")
}

fn load(path: &Path) -> ModelDescription {
    model::load(&path.display().to_string(), ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// Every tensor gguf's reader lists in `files`, with `prefix` before its name, is in `model`
/// with the reversed dimensions, the type and the exact bytes; and the model has no others.
fn assert_tensors(model: &ModelDescription, files: &[(&str, &str)]) {
    let expected = expected();
    let mut count = 0;
    let mut bytes = 0u64;
    for (file, prefix) in files {
        for t in expected["files"][*file]["tensors"].as_array().expect("tensors") {
            let name = t["name"].as_str().expect("name");
            let full = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
            let ours = model.root.tensor(&full).unwrap_or_else(|| panic!("{file}: `{full}` missing"));
            let mut dims: Vec<u64> =
                t["ggml_dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            dims.reverse();
            assert_eq!(ours.shape, dims, "{full}: shape");
            let ty = GgmlType::parse(t["type"].as_str().unwrap()).expect("known type");
            assert_eq!(ours.dtype, DType::from_ggml(ty), "{full}: type");
            assert_eq!(ours.bytes(), t["n_bytes"].as_u64().unwrap(), "{full}: bytes");
            count += 1;
            bytes += ours.bytes();
        }
    }
    assert_eq!(model.tensors().len(), count, "tensors the files do not have");
    assert_eq!(model.bytes(), bytes);
}

#[test]
fn the_ggml_type_table_is_ggufs() {
    let expected = expected();
    let sizes = expected["ggml_quant_sizes"].as_object().expect("sizes");
    for (name, row) in sizes {
        let ty = GgmlType::parse(name).unwrap_or_else(|| panic!("{name} unknown to vramplan"));
        assert_eq!(u64::from(ty.id()), row["id"].as_u64().unwrap(), "{name}");
        assert_eq!(ty.block_size(), row["block_size"].as_u64().unwrap(), "{name}");
        assert_eq!(ty.type_size(), row["type_size"].as_u64().unwrap(), "{name}");
    }
    assert_eq!(GgmlType::all().count(), sizes.len());
}

#[test]
fn a_q4_k_m_file_gives_its_tensors_and_sizes_exactly() {
    let model = load(&dir().join("tiny-llama-q4_k_m.gguf"));
    assert_tensors(&model, &[("tiny-llama-q4_k_m.gguf", "")]);
    let facts = &model.facts;
    assert_eq!((facts.model_type.as_str(), facts.layers.len()), ("llama", 2));
    assert_eq!((facts.hidden_size, facts.num_attention_heads, facts.num_kv_heads), (256, 8, 2));
    assert_eq!((facts.vocab_size, facts.max_positions, facts.intermediate_size), (256, 2048, 256));
    assert!(!facts.tie_word_embeddings && facts.gated_mlp);
    assert_eq!(model.root.find("blk.1").map(|m| m.kind), Some(ModuleKind::Block));
    assert_eq!(model.root.find("blk.0.attn_q").map(|m| m.kind), Some(ModuleKind::Linear));
    assert_eq!(model.root.tensor("blk.0.attn_v.weight").map(|t| t.dtype.name()), Some("q6_K"));
}

#[test]
fn a_moe_file_has_its_experts() {
    let model = load(&dir().join("tiny-moe-q8_0.gguf"));
    assert_tensors(&model, &[("tiny-moe-q8_0.gguf", "")]);
    let moe = model.facts.moe.as_ref().expect("moe");
    assert_eq!((moe.experts, moe.top_k, moe.expert_intermediate_size), (4, 2, 64));
    assert!(model.facts.layers.iter().all(|l| l.moe));
    assert_eq!(model.root.find("blk.0.ffn_up_exps").map(|m| m.kind), Some(ModuleKind::Experts { count: 4 }));
    assert!(model.facts.tie_word_embeddings, "no output.weight: the head is the embedding");
}

#[test]
fn a_split_file_is_read_from_any_part_with_every_part() {
    let parts = [
        "tiny-split-00001-of-00003.gguf",
        "tiny-split-00002-of-00003.gguf",
        "tiny-split-00003-of-00003.gguf",
    ];
    for part in parts {
        let model = load(&dir().join(part));
        assert_tensors(&model, &parts.map(|p| (p, "")));
    }
    let whole = load(&dir().join("tiny-llama-q4_k_m.gguf"));
    let split = load(&dir().join(parts[0]));
    assert_eq!(split.bytes(), whole.bytes());
    assert_eq!(split.facts.layers, whole.facts.layers);
}

#[test]
fn a_folder_with_a_projector_adds_it_under_mmproj() {
    let folder = tempfile::tempdir().expect("temp dir");
    for name in ["tiny-llama-q4_k_m.gguf", "mmproj-tiny.gguf"] {
        std::fs::copy(dir().join(name), folder.path().join(name)).expect("copy");
    }
    let model = load(folder.path());
    assert_tensors(&model, &[("tiny-llama-q4_k_m.gguf", ""), ("mmproj-tiny.gguf", "mmproj")]);
    assert_eq!(model.facts.layers.len(), 2, "the projector's blocks are not the model's layers");
    // The projector alone is a model too.
    let projector = load(&dir().join("mmproj-tiny.gguf"));
    assert_tensors(&projector, &[("mmproj-tiny.gguf", "")]);
}

fn load_err(path: &Path) -> String {
    match model::load(&path.display().to_string(), ImportOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_files_are_refused_with_the_reason() {
    let folder = tempfile::tempdir().expect("temp dir");
    let bytes = std::fs::read(dir().join("tiny-llama-q4_k_m.gguf")).expect("read");
    let truncated = folder.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    assert!(load_err(&truncated).contains("past the end"), "{}", load_err(&truncated));
    let header_cut = folder.path().join("cut.gguf");
    std::fs::write(&header_cut, &bytes[..100]).expect("write");
    assert!(load_err(&header_cut).contains("ends inside its"), "{}", load_err(&header_cut));
    let not_gguf = folder.path().join("not.gguf");
    std::fs::write(&not_gguf, b"GGML\x03\0\0\0 and more").expect("write");
    assert!(load_err(&not_gguf).contains("magic"), "{}", load_err(&not_gguf));
    let mut bad_version = bytes.clone();
    bad_version[4] = 1;
    let v1 = folder.path().join("v1.gguf");
    std::fs::write(&v1, &bad_version).expect("write");
    assert!(load_err(&v1).contains("version 1"), "{}", load_err(&v1));
    let lonely = folder.path().join("tiny-split-00001-of-00003.gguf");
    std::fs::copy(dir().join("tiny-split-00001-of-00003.gguf"), &lonely).expect("copy");
    assert!(load_err(&lonely).contains("missing"), "{}", load_err(&lonely));
}
