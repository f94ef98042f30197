//! Generic models: a folder whose config.json names a class vramplan has no importer for, over a
//! safetensors checkpoint. It builds from the headers (every tensor as stored) with the config's
//! sizes checked against them; what the generic decoder layer cannot describe is refused with
//! the key and the fix. The checkpoints are written here from their tensor tables; the sizes
//! each test expects are worked out by hand from those tables.

mod support;

use serde_json::{Value, json};
use std::path::Path;
use support::write_safetensors;
use vramplan_profiles::model::safetensors::load_folder;
use vramplan_profiles::model::{ImportOptions, ModelDescription, ModuleKind, NormKind, generic};
use vramplan_profiles::{InputError, Location};

/// A Llama-style decoder: hidden 64, 4 query heads and 2 key/value heads of 16, MLP 128,
/// vocabulary 100, `layers` blocks, the output head tied (left out of the checkpoint).
fn llama_tensors(layers: usize) -> Vec<(String, &'static str, Vec<u64>)> {
    let mut t = vec![("model.embed_tokens.weight".to_string(), "BF16", vec![100, 64])];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        t.extend([
            (format!("{p}.input_layernorm.weight"), "BF16", vec![64]),
            (format!("{p}.self_attn.q_proj.weight"), "BF16", vec![64, 64]),
            (format!("{p}.self_attn.k_proj.weight"), "BF16", vec![32, 64]),
            (format!("{p}.self_attn.v_proj.weight"), "BF16", vec![32, 64]),
            (format!("{p}.self_attn.o_proj.weight"), "BF16", vec![64, 64]),
            (format!("{p}.post_attention_layernorm.weight"), "BF16", vec![64]),
            (format!("{p}.mlp.gate_proj.weight"), "BF16", vec![128, 64]),
            (format!("{p}.mlp.up_proj.weight"), "BF16", vec![128, 64]),
            (format!("{p}.mlp.down_proj.weight"), "BF16", vec![64, 128]),
        ]);
    }
    t.push(("model.norm.weight".to_string(), "BF16", vec![64]));
    t
}

fn llama_config(arch: &str, layers: u64) -> Value {
    json!({
        "architectures": [arch],
        "model_type": "my_llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "vocab_size": 100,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16"
    })
}

fn folder(config: &Value, tensors: &[(String, &str, Vec<u64>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

fn load(dir: &Path) -> Result<ModelDescription, InputError> {
    load_folder(dir, ImportOptions::default())
}

/// Loads and expects a refusal at `key` whose problem says `says` and whose fix says `fix`.
fn refused(
    config: &Value,
    tensors: &[(String, &str, Vec<u64>)],
    key: &str,
    says: &str,
    fix: &str,
) -> InputError {
    let dir = folder(config, tensors);
    let err = load(dir.path()).expect_err("a refusal");
    assert_eq!(err.location, Some(Location::Key(key.into())), "{err}");
    assert!(err.problem.contains(says), "problem lacks `{says}`: {err}");
    assert!(err.fix.as_deref().is_some_and(|f| f.contains(fix)), "fix lacks `{fix}`: {err}");
    err
}

#[test]
fn a_renamed_llama_builds_generically_from_its_headers() {
    let tensors = llama_tensors(3);
    let stored = {
        let dir = tempfile::tempdir().unwrap();
        write_safetensors(&dir.path().join("x.safetensors"), &tensors)
    };
    let dir = folder(&llama_config("MyLlamaForCausalLM", 3), &tensors);
    let model = load(dir.path()).unwrap();
    let label = generic::of(&model).expect("labelled generic");
    assert_eq!(label.architecture, "MyLlamaForCausalLM");
    assert!(label.description.contains("generic model"), "{}", label.description);
    assert_eq!(model.architecture, "MyLlamaForCausalLM");
    assert_eq!(model.facts.model_type, generic::MODEL_TYPE);
    // Every tensor as stored: 100·64 + 3·(64 + 64·64 + 2·32·64 + 64·64 + 64 + 3·128·64) + 64
    // elements of two bytes; the tied head adds nothing.
    assert_eq!(stored, 2 * (100 * 64 + 3 * (64 + 4096 + 4096 + 4096 + 64 + 3 * 8192) + 64));
    assert_eq!(model.bytes(), stored);
    let f = &model.facts;
    assert_eq!((f.hidden_size, f.num_attention_heads, f.num_kv_heads, f.head_dim), (64, 4, 2, 16));
    assert_eq!((f.intermediate_size, f.vocab_size, f.max_positions), (128, 100, 2048));
    assert!(f.gated_mlp);
    assert_eq!(f.norm, NormKind::RmsNorm);
    assert_eq!(f.activation, "silu");
    assert!(f.tie_word_embeddings);
    assert_eq!(
        f.layers.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(),
        ["model.layers.0", "model.layers.1", "model.layers.2"]
    );
    assert_eq!(
        model.root.tensor("lm_head.weight").and_then(|t| t.tied_to.as_deref()),
        Some("model.embed_tokens.weight")
    );
    assert_eq!(model.root.find("model.layers.1").map(|m| m.kind), Some(ModuleKind::Block));
    assert!(
        model.notes.iter().any(|n| n.contains("generic model") && n.contains("my_llama")),
        "{:?}",
        model.notes
    );
}

#[test]
fn nested_text_config_gives_the_sizes() {
    let flat = llama_config("MyLlamaForCausalLM", 2);
    let mut text = flat.as_object().unwrap().clone();
    text.remove("architectures");
    let config = json!({"architectures": ["MyLlamaForCausalLM"], "model_type": "my", "text_config": text});
    let dir = folder(&config, &llama_tensors(2));
    let model = load(dir.path()).unwrap();
    assert_eq!(model.facts.num_kv_heads, 2);
    // A mismatch names the nested key.
    let mut bad = config.clone();
    bad["text_config"]["num_hidden_layers"] = json!(5);
    refused(&bad, &llama_tensors(2), "text_config.num_hidden_layers", "5 layers", "config.json");
}

#[test]
fn sizes_that_disagree_with_the_tensors_are_refused() {
    let t = llama_tensors(2);
    let with = |key: &str, value: Value| {
        let mut c = llama_config("MyLlamaForCausalLM", 2);
        c[key] = value;
        c
    };
    refused(
        &with("num_hidden_layers", json!(3)),
        &t,
        "num_hidden_layers",
        "3 layers where the checkpoint has 2 blocks",
        "belongs",
    );
    refused(
        &with("hidden_size", json!(128)),
        &t,
        "hidden_size",
        "`model.embed_tokens.weight` is [100, 64]",
        "belongs",
    );
    refused(
        &with("head_dim", json!(32)),
        &t,
        "head_dim",
        "num_attention_heads × head_dim = 4 × 32 = 128",
        "belongs",
    );
    refused(&with("num_key_value_heads", json!(4)), &t, "num_key_value_heads", "32 outputs", "belongs");
    refused(&with("intermediate_size", json!(256)), &t, "intermediate_size", "256", "belongs");
    refused(&with("vocab_size", json!(99)), &t, "vocab_size", "100 rows", "belongs");
}

#[test]
fn what_the_generic_layer_cannot_describe_is_refused() {
    let config = llama_config("MyHybridForCausalLM", 2);
    // No repeated block list.
    let flat = vec![
        ("embed.weight".to_string(), "BF16", vec![100, 64]),
        ("proj.weight".to_string(), "BF16", vec![64, 64]),
    ];
    refused(&config, &flat, "architectures", "no repeated block list", "custom YAML");
    // A block without attention projections: a state-space layer beside an attention one.
    let mut hybrid: Vec<(String, &str, Vec<u64>)> =
        llama_tensors(2).into_iter().filter(|(n, _, _)| !n.starts_with("model.layers.1.self_attn")).collect();
    hybrid.extend([
        ("model.layers.1.mamba.in_proj.weight".to_string(), "BF16", vec![256, 64]),
        ("model.layers.1.mamba.A_log".to_string(), "F32", vec![8]),
        ("model.layers.1.mamba.out_proj.weight".to_string(), "BF16", vec![64, 128]),
    ]);
    refused(
        &config,
        &hybrid,
        "architectures",
        "block `model.layers.1` has no attention projections",
        "custom YAML",
    );
    // Blocks that differ beyond their MLP.
    let mut extra = llama_tensors(2);
    extra.push(("model.layers.1.self_attn.q_norm.weight".to_string(), "BF16", vec![16]));
    refused(
        &config,
        &extra,
        "architectures",
        "block `model.layers.1` differs from `model.layers.0`",
        "each kind of block",
    );
    // Cache types other than attention's.
    let t = llama_tensors(2);
    let mut types = config.clone();
    types["layer_types"] = json!(["linear_attention", "full_attention"]);
    refused(&types, &t, "layer_types", "1 `linear_attention` layers: an unknown cache type", "cache");
    let mut mamba = config.clone();
    mamba["mamba_d_state"] = json!(16);
    refused(&mamba, &t, "mamba_d_state", "state-space or linear-attention cache", "cache");
    // An encoder-decoder.
    let mut seq2seq = config.clone();
    seq2seq["is_encoder_decoder"] = json!(true);
    refused(&seq2seq, &t, "is_encoder_decoder", "encoder-decoder", "custom YAML");
    let two_stacks: Vec<(String, &str, Vec<u64>)> = llama_tensors(1)
        .into_iter()
        .flat_map(|(n, d, s)| {
            let e = (n.replace("model.layers", "encoder.layers"), d, s.clone());
            [(n.replace("model.layers", "decoder.layers"), d, s), e]
        })
        .collect();
    let mut one = config.clone();
    one["num_hidden_layers"] = json!(1);
    refused(&one, &two_stacks, "architectures", "an encoder and a decoder", "custom YAML");
}

#[test]
fn sliding_windows_follow_layer_types() {
    let mut config = llama_config("MyLlamaForCausalLM", 2);
    config["layer_types"] = json!(["sliding_attention", "full_attention"]);
    config["sliding_window"] = json!(512);
    let dir = folder(&config, &llama_tensors(2));
    let model = load(dir.path()).unwrap();
    let windows: Vec<Option<u64>> = model.facts.layers.iter().map(|l| l.attention_window).collect();
    assert_eq!(windows, [Some(512), None]);
}

#[test]
fn a_known_class_still_uses_its_importer() {
    let dir = folder(&llama_config("LlamaForCausalLM", 2), &llama_tensors(2));
    let model = load(dir.path()).unwrap();
    assert!(generic::of(&model).is_none());
    assert_eq!(model.facts.model_type, "llama");
}

/// A folder of `fixtures/reference/generic/<layout>` (scripts/reference/generic.py): config.json
/// and model.safetensors as transformers 5.24's `save_pretrained` wrote them, the data section
/// restored as zeros; and transformers' own tree of that model. With `class`, config.json's
/// `architectures` names that class instead (a class vramplan has no importer for, so that the
/// folder builds generically as one of an unknown class would).
fn reference_folder_as(layout: &str, class: Option<&str>) -> (tempfile::TempDir, Value) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/generic").join(layout);
    let tree: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("transformers.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    if let Some(class) = class {
        config["architectures"] = json!([class]);
    }
    std::fs::write(dir.path().join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let header = std::fs::read(source.join("model.safetensors.header")).unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, &header).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(header.len() as u64 + tree["data_bytes"].as_u64().unwrap()).unwrap();
    (dir, tree)
}

/// The folder of `fixtures/reference/generic/<layout>` as transformers wrote it.
fn reference_folder(layout: &str) -> (tempfile::TempDir, Value) {
    reference_folder_as(layout, None)
}

/// The classes the generic tests give the reference folders: Cohere 2's and GLM-4's layouts under
/// names vramplan has no importer for (it has for `Cohere2ForCausalLM` and `Glm4ForCausalLM`).
const UNKNOWN_LAYOUTS: [(&str, &str); 2] =
    [("cohere2", "MyCohere2ForCausalLM"), ("glm4", "MyGlm4ForCausalLM")];

/// Cohere 2 and GLM-4 folders as transformers writes them, under class names vramplan has no
/// importer for, build generically with transformers' parameters (names, shapes, dtypes) and
/// ties; only the non-persistent buffers (rotary frequencies), which no checkpoint stores, are
/// not in the tree.
#[test]
fn real_layouts_without_an_importer_build_as_transformers_builds_them() {
    for (layout, class) in UNKNOWN_LAYOUTS {
        let (dir, tree) = reference_folder_as(layout, Some(class));
        let model = load(dir.path()).unwrap_or_else(|e| panic!("{layout}: {e}"));
        assert_eq!(generic::of(&model).map(|g| g.architecture), Some(class.to_string()), "{layout}");
        let ours: std::collections::BTreeMap<String, (Vec<u64>, String)> = model
            .tensors()
            .into_iter()
            .map(|(path, t)| {
                (path, (t.shape.clone(), t.dtype.torch_name().trim_start_matches("torch.").to_string()))
            })
            .collect();
        let mut expected = std::collections::BTreeMap::new();
        for p in tree["parameters"].as_array().unwrap() {
            let shape: Vec<u64> = p[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            expected.insert(p[0].as_str().unwrap().to_string(), (shape, p[2].as_str().unwrap().to_string()));
        }
        // transformers lists a tied parameter once; the tree holds each name of the group.
        let tied: Vec<Vec<String>> = serde_json::from_value(tree["tied"].clone()).unwrap();
        for group in &tied {
            let known = group.iter().find_map(|n| expected.get(n).cloned()).unwrap();
            for name in group {
                expected.insert(name.clone(), known.clone());
            }
        }
        assert_eq!(ours, expected, "{layout}: parameters differ from transformers'");
        let sorted: Vec<Vec<String>> = model
            .tied_groups()
            .into_iter()
            .map(|mut g| {
                g.sort();
                g
            })
            .collect();
        assert_eq!(sorted, tied, "{layout}: tied groups");
        for b in tree["buffers"].as_array().unwrap() {
            assert_eq!(b[3], json!(false), "{layout}: a persistent buffer {b} would be in the checkpoint");
        }
        let layers = model.facts.layers.len() as u64;
        assert_eq!(layers, 4, "{layout}");
    }
    let (dir, _) = reference_folder_as("cohere2", Some(UNKNOWN_LAYOUTS[0].1));
    let model = load(dir.path()).unwrap();
    let windows: Vec<Option<u64>> = model.facts.layers.iter().map(|l| l.attention_window).collect();
    assert_eq!(windows, [Some(128), Some(128), Some(128), None], "Cohere 2's layer_types");
    let (dir, _) = reference_folder_as("glm4", Some(UNKNOWN_LAYOUTS[1].1));
    let model = load(dir.path()).unwrap();
    assert!(model.facts.gated_mlp, "GLM-4's fused gate_up_proj is a gated MLP");
    assert_eq!(model.facts.intermediate_size, 160);
}

/// The same folders under their own classes, `Cohere2ForCausalLM` and `Glm4ForCausalLM`, build
/// through vramplan's importers (not generically): the tree holds exactly transformers' parameters
/// (names, shapes, dtypes) and ties, and its buffers are transformers' rotary buffers.
#[test]
fn real_layouts_of_known_classes_build_through_their_importers() {
    for (layout, class, model_type) in
        [("cohere2", "Cohere2ForCausalLM", "cohere2"), ("glm4", "Glm4ForCausalLM", "glm4")]
    {
        let (dir, tree) = reference_folder(layout);
        let model = load(dir.path()).unwrap_or_else(|e| panic!("{layout}: {e}"));
        assert!(generic::of(&model).is_none(), "{layout}: built generically");
        assert_eq!(model.architecture, class);
        assert_eq!(model.facts.model_type, model_type);
        let mut ours = Vec::new();
        let mut buffers = Vec::new();
        for (path, t) in model.tensors() {
            let entry =
                (path, t.shape.clone(), t.dtype.torch_name().trim_start_matches("torch.").to_string());
            if matches!(t.kind, vramplan_profiles::model::TensorKind::Buffer { .. }) {
                buffers.push(entry);
            } else {
                ours.push(entry);
            }
        }
        let listed = |key: &str| -> Vec<(String, Vec<u64>, String)> {
            tree[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let shape = p[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
                    (p[0].as_str().unwrap().to_string(), shape, p[2].as_str().unwrap().to_string())
                })
                .collect()
        };
        // transformers lists a tied parameter once; the tree holds each name of the group.
        let tied: Vec<Vec<String>> = serde_json::from_value(tree["tied"].clone()).unwrap();
        let mut expected = listed("parameters");
        for group in &tied {
            let known = expected.iter().find(|p| group.contains(&p.0)).cloned().unwrap();
            for name in group.iter().filter(|n| **n != known.0) {
                expected.push((name.clone(), known.1.clone(), known.2.clone()));
            }
        }
        ours.sort();
        expected.sort();
        assert_eq!(ours, expected, "{layout}: parameters differ from transformers'");
        // Names and shapes: generic.py recorded the buffers after casting the model to its
        // dtype; the meta-device fixtures (fixtures/reference/models) hold them in float32.
        let names_and_shapes = |mut v: Vec<(String, Vec<u64>, String)>| {
            v.sort();
            v.into_iter().map(|(n, s, _)| (n, s)).collect::<Vec<_>>()
        };
        assert_eq!(
            names_and_shapes(buffers),
            names_and_shapes(listed("buffers")),
            "{layout}: buffers differ from transformers'"
        );
        let mut sorted: Vec<Vec<String>> = model
            .tied_groups()
            .into_iter()
            .map(|mut g| {
                g.sort();
                g
            })
            .collect();
        sorted.sort();
        assert_eq!(sorted, tied, "{layout}: tied groups");
    }
}

/// A GPTQ checkpoint (`qweight` int32 words of eight 4-bit values `[in / 8, out]`, `qzeros`,
/// `scales`, `g_idx`) under an unknown class: the packed projections have no float matrix to
/// measure, so config.json's heads and widths stand and the notes say so; the bytes are the
/// headers'.
#[test]
fn a_quantized_checkpoint_builds_with_its_widths_unchecked() {
    let mut tensors = Vec::new();
    for (name, dtype, shape) in llama_tensors(2) {
        let Some(module) = name.strip_suffix(".weight").filter(|m| m.contains("_proj")) else {
            tensors.push((name, dtype, shape));
            continue;
        };
        let (out, input) = (shape[0], shape[1]);
        tensors.extend([
            (format!("{module}.qweight"), "I32", vec![input / 8, out]),
            (format!("{module}.qzeros"), "I32", vec![input / 32, out / 8]),
            (format!("{module}.scales"), "F16", vec![input / 32, out]),
            (format!("{module}.g_idx"), "I32", vec![input]),
        ]);
    }
    let stored = {
        let dir = tempfile::tempdir().unwrap();
        write_safetensors(&dir.path().join("x.safetensors"), &tensors)
    };
    let dir = folder(&llama_config("MyLlamaForCausalLM", 2), &tensors);
    let model = load(dir.path()).unwrap();
    assert!(generic::of(&model).is_some());
    assert_eq!(model.bytes(), stored);
    assert_eq!((model.facts.num_kv_heads, model.facts.intermediate_size), (2, 128));
    assert!(model.facts.gated_mlp, "gate, up and down");
    for said in ["stored quantized: their widths are not checked", "intermediate size 128 is not checked"] {
        assert!(model.notes.iter().any(|n| n.contains(said)), "no note `{said}`: {:?}", model.notes);
    }
}

/// Experts stored one module each (4.x names): described so, with the note that transformers
/// 5.x fuses them (and bitsandbytes then leaves them unquantized); the routing from config.json,
/// the width from the expert tensors.
#[test]
fn per_expert_checkpoints_build_with_a_note_on_fusing() {
    let mut tensors: Vec<(String, &str, Vec<u64>)> =
        llama_tensors(2).into_iter().filter(|(n, _, _)| !n.contains(".mlp.")).collect();
    for layer in 0..2 {
        tensors.push((format!("model.layers.{layer}.mlp.gate.weight"), "BF16", vec![4, 64]));
        for expert in 0..4 {
            let p = format!("model.layers.{layer}.mlp.experts.{expert}");
            tensors.extend([
                (format!("{p}.gate_proj.weight"), "BF16", vec![32, 64]),
                (format!("{p}.up_proj.weight"), "BF16", vec![32, 64]),
                (format!("{p}.down_proj.weight"), "BF16", vec![64, 32]),
            ]);
        }
    }
    let mut config = llama_config("MyMoeForCausalLM", 2);
    config["num_experts"] = json!(4);
    config["num_experts_per_tok"] = json!(2);
    let dir = folder(&config, &tensors);
    let model = load(dir.path()).unwrap();
    let moe = model.facts.moe.as_ref().expect("MoE facts");
    assert_eq!((moe.experts, moe.top_k, moe.expert_intermediate_size), (4, 2, 32));
    assert!(model.facts.layers.iter().all(|l| l.moe));
    assert!(model.facts.gated_mlp);
    assert!(model.notes.iter().any(|n| n.contains("transformers 5.x fuses them")), "{:?}", model.notes);
    // The routing is config.json's to give.
    config.as_object_mut().unwrap().remove("num_experts_per_tok");
    refused(&config, &tensors, "num_experts_per_tok", "does not say how many each token is routed to", "add");
    config["num_experts_per_tok"] = json!(2);
    config["num_experts"] = json!(8);
    refused(
        &config,
        &tensors,
        "num_experts",
        "8 experts where the checkpoint's MoE layers have 4",
        "belongs",
    );
}

/// A block whose MLP is wider than the others' is not the generic layer's one kind of block: its
/// activations would be charged at the first block's width.
#[test]
fn blocks_of_different_widths_are_refused() {
    let mut tensors = llama_tensors(2);
    for (name, _, shape) in &mut tensors {
        if name.starts_with("model.layers.1.mlp.") {
            *shape = if name.ends_with("down_proj.weight") { vec![64, 512] } else { vec![512, 64] };
        }
    }
    refused(&llama_config("WidthsForCausalLM", 2), &tensors, "architectures", "differs", "custom YAML");
}
