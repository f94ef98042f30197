//! `--quant fp8` under transformers is `FineGrainedFP8Config`, quantized while loading: what the
//! real quantizer did on each compute capability (`fixtures/reference/fp8-while-loading-v5.json`,
//! `scripts/reference/fp8_while_loading.py`: transformers 5.24's `validate_environment` and
//! `_process_model_before_weight_loading` on a meta-device Llama) is what the estimate sizes.
//! Where the projections became `FP8Linear` the weights are held in fp8; where they stayed
//! `Linear` (below 8.9, `dequantize` set) they load unquantized, as without `--quant`, and the
//! estimate says so. vLLM keeps fp8 storage there (FP8 Marlin), so its estimate does not move.

use vramplan_tests::vramplan;

fn weights(hardware: &str, extra: &[&str]) -> (u64, Vec<String>) {
    let mut args =
        vec!["estimate", "llama-3-8b", "--hardware", hardware, "--mode", "inference", "--batch", "1"];
    args.extend_from_slice(&["--seq", "128", "--json"]);
    args.extend_from_slice(extra);
    let out = vramplan(&args);
    // Exit 1 where it does not fit (16 GB of bf16 on a T4): the estimate is there all the same.
    assert!(out.code <= 1, "{args:?}: {}", out.stderr);
    let json = out.json();
    let warnings =
        json["warnings"].as_array().map(|w| w.iter().filter_map(|s| s.as_str()).map(String::from).collect());
    (json["devices"][0]["components"]["weights"].as_u64().expect("weights"), warnings.unwrap_or_default())
}

#[test]
fn fp8_weights_are_held_where_transformers_converts_the_layers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/reference/fp8-while-loading-v5.json");
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    let records = data["records"].as_array().expect("records");
    assert!(records.len() >= 4, "{} capabilities", records.len());
    for record in records {
        let capability = record["capability"].as_str().expect("capability");
        // A built-in profile of that compute capability (checked against the profile itself).
        let hardware = match capability {
            "7.5" => "t4",
            "8.0" => "a100-80gb",
            "8.6" => "rtx3090",
            "8.9" => "l4",
            "9.0" => "h100-80gb",
            other => panic!("no profile named for compute capability {other}"),
        };
        let profile = vramplan_profiles::hardware::load(hardware).expect("profile");
        assert_eq!(profile.devices[0].compute_capability.to_string(), capability, "{hardware}");
        let fp8_linear =
            record["projection_classes"].as_array().expect("classes").iter().any(|c| c == "FP8Linear");
        let (unquantized, _) = weights(hardware, &[]);
        let (fp8, warnings) = weights(hardware, &["--quant", "fp8"]);
        if fp8_linear {
            assert!(fp8 * 10 < unquantized * 6, "{hardware}: fp8 {fp8} against unquantized {unquantized}");
        } else {
            assert_eq!(fp8, unquantized, "{hardware}: transformers leaves the layers unquantized here");
            assert!(warnings.iter().any(|w| w.contains("FineGrainedFP8Config")), "{hardware}: {warnings:?}");
            let (vllm, _) = weights(hardware, &["--quant", "fp8", "--engine", "vllm"]);
            assert!(vllm * 10 < unquantized * 6, "{hardware}: vLLM keeps fp8 ({vllm} against {unquantized})");
        }
    }
}
