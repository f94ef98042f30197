//! Import speed: `inspect` of DeepSeek-V3 from its `config.json` (target under 5 ms), and the
//! headers of a 100-shard safetensors folder (target under 50 ms), alone and laid over a config.
//!
//! Run: `cargo bench -p vramplan-profiles --bench import -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use vramplan_profiles::model::{ImportOptions, hf, safetensors};

fn inspect_deepseek_v3(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/published/models/deepseek-ai__DeepSeek-R1/config.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("skipping the DeepSeek-V3 bench: {}: {e}", path.display());
            return;
        }
    };
    if let Err(e) = hf::from_config_text(&text, "DeepSeek-R1", ImportOptions::default()) {
        eprintln!("skipping the DeepSeek-V3 bench: {e}");
        return;
    }
    c.bench_function("inspect DeepSeek-V3 config", |b| {
        b.iter(|| {
            let model = hf::from_config_text(black_box(&text), "DeepSeek-R1", ImportOptions::default());
            model.map(|m| m.summary())
        })
    });
}

/// A Mixtral-shaped model, small widths, 100 layers: shard N holds layer N (31 tensors: 8
/// experts × 3, attention 4, router, 2 norms); the first shard also the embedding, the last the
/// final norm and the head. Data sections are zero-filled (sparse).
const LAYERS: u64 = 100;
const HIDDEN: u64 = 64;
const INTERMEDIATE: u64 = 128;
const KV_WIDTH: u64 = 32;
const EXPERTS: u64 = 8;
const VOCAB: u64 = 1000;

fn layer_tensors(layer: u64) -> Vec<(String, Vec<u64>)> {
    let p = format!("model.layers.{layer}");
    let mut tensors = vec![
        (format!("{p}.input_layernorm.weight"), vec![HIDDEN]),
        (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]),
        (format!("{p}.self_attn.q_proj.weight"), vec![HIDDEN, HIDDEN]),
        (format!("{p}.self_attn.k_proj.weight"), vec![KV_WIDTH, HIDDEN]),
        (format!("{p}.self_attn.v_proj.weight"), vec![KV_WIDTH, HIDDEN]),
        (format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, HIDDEN]),
        (format!("{p}.block_sparse_moe.gate.weight"), vec![EXPERTS, HIDDEN]),
    ];
    for e in 0..EXPERTS {
        let q = format!("{p}.block_sparse_moe.experts.{e}");
        tensors.push((format!("{q}.w1.weight"), vec![INTERMEDIATE, HIDDEN]));
        tensors.push((format!("{q}.w2.weight"), vec![HIDDEN, INTERMEDIATE]));
        tensors.push((format!("{q}.w3.weight"), vec![INTERMEDIATE, HIDDEN]));
    }
    tensors
}

fn write_shard(path: &Path, tensors: &[(String, Vec<u64>)]) -> std::io::Result<u64> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<u64>() * 2;
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let text = serde_json::to_vec(&header)?;
    let mut file = File::create(path)?;
    file.write_all(&(text.len() as u64).to_le_bytes())?;
    file.write_all(&text)?;
    file.set_len(8 + text.len() as u64 + offset)?;
    Ok(offset)
}

/// Writes the 100 shards and the index into `dir`.
fn write_checkpoint(dir: &Path) -> std::io::Result<()> {
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for layer in 0..LAYERS {
        let mut tensors = layer_tensors(layer);
        if layer == 0 {
            tensors.push(("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]));
        }
        if layer == LAYERS - 1 {
            tensors.push(("model.norm.weight".into(), vec![HIDDEN]));
            tensors.push(("lm_head.weight".into(), vec![VOCAB, HIDDEN]));
        }
        let file = format!("model-{:05}-of-{LAYERS:05}.safetensors", layer + 1);
        total += write_shard(&dir.join(&file), &tensors)?;
        for (name, _) in &tensors {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
}

fn mixtral_config() -> String {
    json!({
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    })
    .to_string()
}

fn read_100_shard_headers(c: &mut Criterion) {
    let Ok(names_only) = tempfile::tempdir() else { return };
    let Ok(with_config) = tempfile::tempdir() else { return };
    for dir in [names_only.path(), with_config.path()] {
        if let Err(e) = write_checkpoint(dir) {
            eprintln!("skipping the shard benches: cannot write {}: {e}", dir.display());
            return;
        }
    }
    if std::fs::write(with_config.path().join("config.json"), mixtral_config()).is_err() {
        return;
    }
    match safetensors::load_folder(names_only.path(), ImportOptions::default()) {
        Ok(model) => assert_eq!(model.facts.layers.len() as u64, LAYERS),
        Err(e) => {
            eprintln!("skipping the shard benches: {e}");
            return;
        }
    }
    c.bench_function("100-shard headers, no config", |b| {
        b.iter(|| safetensors::load_folder(black_box(names_only.path()), ImportOptions::default()))
    });
    if let Err(e) = safetensors::load_folder(with_config.path(), ImportOptions::default()) {
        eprintln!("skipping the config overlay bench: {e}");
        return;
    }
    c.bench_function("100-shard headers over a Mixtral config", |b| {
        b.iter(|| safetensors::load_folder(black_box(with_config.path()), ImportOptions::default()))
    });
}

criterion_group!(benches, inspect_deepseek_v3, read_100_shard_headers);
criterion_main!(benches);
