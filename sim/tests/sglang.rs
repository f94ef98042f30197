//! SGLang's token pool (`max_total_num_tokens`) against published SGLang startup logs
//! (`fixtures/published/sglang/sglang.csv`, sources in its README), through the estimate the CLI
//! prints; and the settings SGLang refuses, refused with its reason.

use std::collections::BTreeMap;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::engines::estimate::sglang_estimate;
use vramplan_sim::engines::sglang;
use vramplan_sim::workload::{Engine, Parallelism, Quant, Workload};

/// The published token counts are held to this fraction.
const TOLERANCE: f64 = 0.05;

fn rows() -> Vec<BTreeMap<String, String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/published/sglang/sglang.csv");
    let mut reader = csv::Reader::from_path(path).expect("sglang.csv in fixtures/published/sglang");
    reader.deserialize::<BTreeMap<String, String>>().map(|row| row.expect("a CSV row")).collect()
}

fn load(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("a built-in model")
}

fn workload(tp: u32, fraction: Option<f64>, quant: Quant) -> Workload {
    Workload {
        seq: 4096,
        quant,
        parallelism: if tp > 1 { Parallelism::tensor(tp) } else { Parallelism::Single },
        engine: Engine::Sglang {
            mem_fraction_static: fraction,
            max_total_tokens: None,
            dp_size: None,
            ep_size: None,
        },
        ..Workload::default()
    }
}

#[test]
fn token_pool_matches_published_logs() {
    let rows = rows();
    // Five published runs, four distinct configurations (the two 8B H100 rows are one).
    assert!(rows.len() >= 5, "the published SGLang runs");
    let mut failures = Vec::new();
    println!("{:<24} {:>14} {:>12} {:>12} {:>8}", "id", "gpus", "published", "ours", "error");
    for row in &rows {
        let model = load(&row["builtin"]);
        let (count, gpu) = row["gpus"].split_once('x').expect("`Nx gpu`");
        let profile = hardware::load(&format!("{}x{}", count.trim(), gpu.trim())).expect("a built-in GPU");
        let tp: u32 = row["tp"].parse().expect("tp");
        let fraction: f64 = row["mem_fraction_static"].parse().expect("a fraction");
        let quant = match row["quant"].as_str() {
            "none" => Quant::None,
            "fp8" => Quant::Fp8 { block: 128 },
            other => panic!("quant {other}"),
        };
        let estimate = sglang_estimate(&model, &profile, &workload(tp, Some(fraction), quant))
            .expect("an SGLang estimate");
        let ours = estimate.kv_capacity_tokens.expect("a token pool") as f64;
        let published: f64 = row["max_total_num_tokens"].parse().expect("tokens");
        let error = (ours - published) / published;
        println!(
            "{:<24} {:>14} {:>12} {:>12} {:>+7.2}%",
            row["id"],
            row["gpus"],
            published,
            ours,
            100.0 * error
        );
        if error.abs() > TOLERANCE {
            failures.push(format!("{}: {ours} tokens against {published} published", row["id"]));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn estimate_spans_the_replicas_and_names_the_single_gpu_default() {
    let model = load("llama-3.1-8b-instruct");
    let profile = hardware::load("4xh100-80gb").expect("a profile");
    let one = sglang_estimate(&model, &profile, &workload(1, None, Quant::None)).expect("one GPU");
    assert_eq!(one.devices.len(), 1);
    assert!(one.warnings.iter().any(|w| w.contains("--parallel tp=4")), "{:?}", one.warnings);
    let mut replicas = workload(2, None, Quant::None);
    replicas.engine = Engine::Sglang {
        mem_fraction_static: None,
        max_total_tokens: Some(100_000),
        dp_size: Some(2),
        ep_size: None,
    };
    let two_by_two = sglang_estimate(&model, &profile, &replicas).expect("tp 2 × dp 2");
    assert_eq!(two_by_two.devices.len(), 4);
    // --max-total-tokens bounds the profiled pool.
    assert_eq!(two_by_two.kv_capacity_tokens, Some(100_000));
    let mut too_many = replicas.clone();
    too_many.engine =
        Engine::Sglang { mem_fraction_static: None, max_total_tokens: None, dp_size: Some(4), ep_size: None };
    assert!(sglang_estimate(&model, &profile, &too_many).is_err(), "8 GPUs on a 4-GPU profile");
}

#[test]
fn refuses_what_sglang_refuses() {
    let llama = load("llama-3.1-8b-instruct");
    let device = hardware::load("h100-80gb").expect("a profile").devices[0].clone();
    // 32 heads do not split over 3 ranks.
    let err = sglang::budget(&llama, &device, &workload(3, None, Quant::None), 3, true).expect_err("3 ranks");
    assert!(err.fix.is_some_and(|f| f.contains("32")));
    // A fraction outside (0, 1).
    assert!(sglang::budget(&llama, &device, &workload(1, Some(1.2), Quant::None), 1, true).is_err());
    // Expert parallelism: a dense model has no experts; a MoE model needs ep_size == tp_size.
    let mut ep = workload(2, None, Quant::None);
    ep.engine =
        Engine::Sglang { mem_fraction_static: None, max_total_tokens: None, dp_size: None, ep_size: Some(2) };
    assert!(sglang::budget(&llama, &device, &ep, 2, true).is_err());
    let mixtral = load("mixtral-8x7b");
    let mut ep4 = workload(2, None, Quant::None);
    ep4.engine =
        Engine::Sglang { mem_fraction_static: None, max_total_tokens: None, dp_size: None, ep_size: Some(4) };
    let err = sglang::budget(&mixtral, &device, &ep4, 2, true).expect_err("ep 4 over tp 2");
    assert!(err.problem.contains("ep_size * moe_dp_size == tp_size"), "{}", err.problem);
    assert!(sglang::budget(&mixtral, &device, &ep, 2, true).is_ok());
    // Weights past the static fraction leave no pool: the budget says it does not fit.
    let big = load("llama-3.1-70b");
    let b = sglang::budget(&big, &device, &workload(1, None, Quant::None), 1, true).expect("a budget");
    assert!(!b.fits && b.max_total_num_tokens == 0);
    // The estimate says why, as SGLang does: the fraction that would leave a pool (weights over
    // the memory free before loading), or that no fraction does.
    let h100 = hardware::load("h100-80gb").expect("a profile");
    let qwen = load("qwen2.5-32b");
    let tight = sglang_estimate(&qwen, &h100, &workload(1, Some(0.7), Quant::None)).expect("an estimate");
    let expected = b_weights_over_pre(&qwen, &device);
    assert!(
        tight
            .warnings
            .iter()
            .any(|w| w.contains("Loaded weights leave no GPU memory") && w.contains(&expected)),
        "{:?} (expected {expected})",
        tight.warnings
    );
    let whole = sglang_estimate(&big, &h100, &workload(1, None, Quant::None)).expect("an estimate");
    assert!(whole.warnings.iter().any(|w| w.contains("--parallel tp=N")), "{:?}", whole.warnings);
}

/// SGLang's minimum viable fraction, `1 − available / pre` = weights / pre, rounded up to 0.001
/// as its message prints it.
fn b_weights_over_pre(model: &ModelDescription, device: &vramplan_profiles::hardware::Device) -> String {
    let b = sglang::budget(model, device, &workload(1, Some(0.7), Quant::None), 1, true).expect("a budget");
    format!("{:.3}", (b.weights_bytes as f64 / b.pre_load_bytes as f64 * 1000.0).ceil() / 1000.0)
}

#[test]
fn default_fraction_follows_the_gpu() {
    let llama = load("llama-3.1-8b-instruct");
    let h100 = hardware::load("h100-80gb").expect("a profile").devices[0].clone();
    let b = sglang::budget(&llama, &h100, &workload(1, None, Quant::None), 1, true).expect("a budget");
    // SGLang 0.5.23 on an 81559 MiB H100 at TP 1: round((81559 − 13904) / 81559, 3).
    assert_eq!(b.mem_fraction_static, 0.830);
    assert_eq!(b.defaults.chunked_prefill_size, 8192);
    assert_eq!(b.defaults.cuda_graph_max_bs, 256);
}
