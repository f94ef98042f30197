//! `vramplan inspect` as a user runs it: published parameter counts, byte totals against the
//! checkpoints' own `total_size`, and the JSON fields scripts rely on.

use vramplan_tests::{shared_dir, shared_model, vramplan};

fn total_size(folder: &str) -> u64 {
    let path = shared_dir().join("models").join(folder).join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&path).expect("index file in fixtures/published/models");
    let index: serde_json::Value = serde_json::from_str(&text).expect("index is JSON");
    index["metadata"]["total_size"].as_u64().expect("metadata.total_size")
}

#[test]
fn pythia_matches_the_model_card_and_json_has_the_contract_fields() {
    let out = vramplan(&["inspect", "pythia-2.8b", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json = out.json();
    // Pythia model card: 2,775,208,960 parameters.
    assert_eq!(json["params"], 2_775_208_960u64);
    assert_eq!(json["dtype"], "fp16");
    assert_eq!(json["layers"], 32);
    // fp16: 2 bytes per parameter plus the fp32 rotary buffers `inv_freq` and 5.x's copy
    // `original_inv_freq` (rotary_pct 0.25 of head dim 80 = 20 dims, 10 frequencies × 4 bytes).
    assert_eq!(json["bytes"], 2_775_208_960u64 * 2 + 2 * 10 * 4);
    let modules = json["modules"].as_array().expect("modules list");
    let names: Vec<&str> = modules.iter().filter_map(|m| m["name"].as_str()).collect();
    // transformers 5.x names the head `lm_head` (`GPTNeoXForCausalLM.lm_head`); 4.x `embed_out`.
    // `GPTNeoXModel`'s children in definition order, its tensorless `emb_dropout` included.
    assert_eq!(
        names,
        [
            "gpt_neox.embed_in",
            "gpt_neox.emb_dropout",
            "gpt_neox.layers",
            "gpt_neox.final_layer_norm",
            "gpt_neox.rotary_emb",
            "lm_head"
        ]
    );
    for m in modules {
        assert!(m["params"].is_u64() && m["bytes"].is_u64(), "{m}");
    }
}

#[test]
fn naming_v4_keeps_the_gpt_neox_head_name() {
    // transformers 4.x: `GPTNeoXForCausalLM.embed_out` (5.x renames it `lm_head`).
    let json = vramplan(&["inspect", "pythia-2.8b", "--naming", "v4", "--json"]).json();
    let modules = json["modules"].as_array().expect("modules list");
    assert_eq!(modules.last().and_then(|m| m["name"].as_str()), Some("embed_out"));
    assert_eq!(json["params"], 2_775_208_960u64);
}

#[test]
fn dtype_flag_recasts_floating_parameters() {
    let json = vramplan(&["inspect", "pythia-2.8b", "--dtype", "fp32", "--json"]).json();
    assert_eq!(json["dtype"], "fp32");
    assert_eq!(json["bytes"], 2_775_208_960u64 * 4 + 2 * 10 * 4);
}

#[test]
fn checkpoint_folders_match_their_total_size() {
    // Each case: folder, and the bytes transformers holds beyond the checkpoint: the fp32
    // `model.rotary_emb.inv_freq` buffer of head_dim / 2 values, which checkpoints do not store,
    // and in 5.x naming its copy `original_inv_freq`. Mixtral's checkpoint uses 4.x names, so it
    // is read in 4.x naming, which has no copy. 5.x Gemma also holds a non-persistent bf16
    // scalar `embed_tokens.embed_scale` (`modeling_gemma.py`): two bytes.
    let cases = [
        ("meta-llama__Meta-Llama-3-8B", 2 * 128 / 2 * 4),
        ("mistralai__Mistral-7B-v0.1", 2 * 128 / 2 * 4),
        ("mistralai__Mixtral-8x7B-v0.1", 128 / 2 * 4),
        ("google__gemma-2b", 2 * 256 / 2 * 4 + 2),
    ];
    for (folder, buffer_bytes) in cases {
        let out = vramplan(&["inspect", &shared_model(folder), "--json"]);
        assert_eq!(out.code, 0, "{folder}: {}", out.stderr);
        let json = out.json();
        assert_eq!(json["bytes"].as_u64(), Some(total_size(folder) + buffer_bytes), "{folder}");
        assert_eq!(json["buffer_bytes"].as_u64(), Some(buffer_bytes), "{folder}");
    }
}

#[test]
fn mixtral_reports_total_and_active_parameters() {
    let json = vramplan(&["inspect", "mixtral-8x7b", "--json"]).json();
    // Mistral AI: 46.7B total, 12.9B active per token.
    assert_eq!(json["params"], 46_702_792_704u64);
    let active = json["moe"]["active_params"].as_u64().expect("moe.active_params");
    assert!((12_850_000_000..12_950_000_000).contains(&active), "{active}");
    assert_eq!(json["moe"]["top_k"], 2);
}

#[test]
fn table_output_names_the_largest_unit_and_tied_groups() {
    let out = vramplan(&["inspect", &shared_model("google__gemma-2b")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Gemma ties lm_head to the input embedding; the embedding (256000 × 2048 bf16 = 1000 MiB)
    // is the largest unit accelerate places.
    assert!(out.stdout.contains("model.embed_tokens.weight = lm_head.weight"), "{}", out.stdout);
    assert!(out.stdout.contains("largest unit  model.embed_tokens (1000.00 MiB)"), "{}", out.stdout);
}
