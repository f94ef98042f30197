//! Models described from a listing of their tensors (`safetensors::load_listed`), the way the
//! Python package describes a live `torch.nn.Module`: the listing is what transformers built on
//! the meta device (`fixtures/reference/models/v5/NAME.json`: `named_parameters()`, tied ones
//! once, and `named_buffers()`), written as a safetensors header over virtual data.

use serde_json::{Map, Value, json};
use vramplan_profiles::DType;
use vramplan_profiles::model::{self, ImportOptions, catalog, safetensors};

/// transformers' listing of built-in `name` as a safetensors header's JSON, and its parameter
/// count.
fn listing(name: &str) -> (String, u64) {
    let path = format!("{}/../fixtures/reference/models/v5/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let mut header = Map::new();
    let buffers: Map<String, Value> = fixture["buffers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| (b[0].as_str().expect("name").to_string(), b[3].clone()))
        .collect();
    header.insert("__metadata__".into(), json!({"buffers": Value::Object(buffers).to_string()}));
    let mut offset = 0u64;
    let tensors = fixture["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(fixture["buffers"].as_array().into_iter().flatten());
    for tensor in tensors {
        let (name, shape, dtype) =
            (tensor[0].as_str().expect("name"), &tensor[1], tensor[2].as_str().expect("dtype"));
        let numel: u64 = shape.as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim")).product();
        let (code, size) = match dtype {
            "bfloat16" => ("BF16", 2),
            "float16" => ("F16", 2),
            "float32" => ("F32", 4),
            "int64" => ("I64", 8),
            "bool" => ("BOOL", 1),
            other => panic!("{name}: dtype {other}"),
        };
        header.insert(
            name.into(),
            json!({"dtype": code, "shape": shape, "data_offsets": [offset, offset + numel * size]}),
        );
        offset += numel * size;
    }
    (Value::Object(header).to_string(), fixture["parameter_count"].as_u64().expect("count"))
}

#[test]
fn a_listed_module_with_its_config_is_the_builtin() {
    for name in ["qwen2.5-0.5b", "pythia-410m", "gpt2", "mixtral-8x7b", "gemma-2-2b"] {
        let (header, _) = listing(name);
        let config = catalog::builtin_config(name).expect("built-in");
        let listed = safetensors::load_listed(
            Some((config, "module.config")),
            &header,
            "module",
            ImportOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The fixture's model was built in bfloat16 (`from_pretrained(dtype=torch.bfloat16)`).
        let builtin = model::load(name, ImportOptions::default()).expect("built-in").cast(DType::BF16);
        let (a, b) = (listed.summary(), builtin.summary());
        assert_eq!((a.params, a.bytes), (b.params, b.bytes), "{name}");
        assert_eq!(listed.facts.layers.len(), builtin.facts.layers.len(), "{name}");
    }
}

#[test]
fn a_listed_module_without_a_config_keeps_its_weights_exactly() {
    let (header, parameters) = listing("pythia-410m");
    let listed = safetensors::load_listed(None, &header, "module", ImportOptions::default()).expect("built");
    let summary = listed.summary();
    // The tensors themselves: transformers' parameter count (its buffers apart), and every byte
    // of the listing.
    assert_eq!(summary.params, parameters);
    let bytes: u64 = serde_json::from_str::<Value>(&header)
        .expect("JSON")
        .as_object()
        .expect("object")
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(_, t)| {
            t["data_offsets"][1].as_u64().expect("end") - t["data_offsets"][0].as_u64().expect("begin")
        })
        .sum();
    assert_eq!(summary.bytes, bytes);
}

#[test]
fn a_bad_listing_is_an_input_error() {
    let error =
        safetensors::load_listed(None, "{not json", "module", ImportOptions::default()).expect_err("refused");
    assert!(error.to_string().contains("not valid JSON"), "{error}");
    let overlapping = r#"{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}"#;
    assert!(safetensors::load_listed(None, overlapping, "module", ImportOptions::default()).is_err());
}
