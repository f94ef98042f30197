//! The generic model against the reference tracer: every built-in family the tracer covers
//! (`fixtures/reference/trace/v5.json`, its task-head rows left out) is built as if its class
//! were unknown (its published config with `architectures` and `model_type` renamed, over a
//! header-only safetensors checkpoint written from the importer's description as
//! `save_pretrained` stores it: parameters and persistent buffers, tied copies left out, in the
//! 4.x names published checkpoints use), estimated with the generic decoder layer, and its peak
//! compared with the traced one as `tracer.rs` compares the importers' (the cuBLAS workspace,
//! which the CPU tracer never makes, left out). The figures are docs/memory-model.md's
//! "Generic models" table; the error must stay within what `model::generic` states.

mod support;

use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use support::{compare, fixture};
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, TensorKind, catalog, generic};

/// Writes `model`'s state dict as `save_pretrained` stores it (parameters and persistent
/// buffers, tied copies left out) into a safetensors file with a sparse data section.
fn write_checkpoint(model: &ModelDescription, path: &Path) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, tensor) in model.tensors() {
        if tensor.tied_to.is_some() || tensor.kind == (TensorKind::Buffer { persistent: false }) {
            continue;
        }
        let bytes = tensor.bytes();
        let dtype = tensor.dtype.safetensors_name().expect("a safetensors dtype");
        header.insert(
            name,
            json!({"dtype": dtype, "shape": tensor.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header).expect("JSON");
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut file = std::fs::File::create(path).expect("create the checkpoint");
    file.write_all(&(text.len() as u64).to_le_bytes()).expect("write");
    file.write_all(&text).expect("write");
    file.set_len(8 + text.len() as u64 + offset).expect("size");
}

/// The built-in `name` (or the traced `config`, where the record has one) as if its class were
/// unknown: a folder with its config renamed and a header-only checkpoint of its description.
fn generic_of(
    name: &str,
    config: Option<&serde_json::Value>,
    real: &ModelDescription,
    dir: &Path,
) -> Result<ModelDescription, String> {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).expect("folder");
    let mut config: serde_json::Value = match config {
        Some(config) => config.clone(),
        None => serde_json::from_str(catalog::builtin_config(name).expect("built-in config")).expect("JSON"),
    };
    let arch = config["architectures"][0].as_str().expect("a class").to_string();
    config["architectures"] = json!([format!("Unknown{arch}")]);
    config["model_type"] = json!(format!("unknown_{}", config["model_type"].as_str().unwrap_or("")));
    std::fs::write(folder.join("config.json"), config.to_string()).expect("config");
    write_checkpoint(real, &folder.join("model.safetensors"));
    let model =
        model::safetensors::load_folder(&folder, ImportOptions::default()).map_err(|e| e.to_string())?;
    assert!(generic::of(&model).is_some(), "{name}: not built as generic");
    // Exact but for the buffers a checkpoint never stores (rotary frequencies, masks).
    let rebuilt: u64 = real
        .tensors()
        .iter()
        .filter(|(_, t)| t.kind == (TensorKind::Buffer { persistent: false }))
        .map(|(_, t)| t.bytes())
        .sum();
    assert_eq!(model.bytes(), real.bytes() - rebuilt, "{name}: the generic model's bytes differ");
    Ok(model)
}

#[test]
fn generic_estimates_stay_within_the_stated_error() {
    let fixture = fixture("v5.json");
    let hardware = hardware::load("h100-80gb").expect("profile");
    let dir = std::env::temp_dir().join(format!("vramplan-generic-traced-{}", std::process::id()));
    let mut models: BTreeMap<String, Result<(ModelDescription, ModelDescription), String>> = BTreeMap::new();
    // Per family: (generic |errors|, importer |errors|).
    let mut families: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut all = Vec::new();
    for r in &fixture.records {
        let (Ok(traced), None) = (r.traced_peak(), &r.cls) else { continue };
        let built = models.entry(r.model.clone()).or_insert_with(|| {
            let real = r.built_model();
            generic_of(&r.model, r.config.as_ref(), &real, &dir).map(|g| (g, real))
        });
        let Ok((generic_model, real)) = built.clone() else { continue };
        let workload = r.workload();
        let peak = |m: &ModelDescription| compare(m, &hardware, &workload, traced, &r.model).error;
        let (g, i) = (peak(&generic_model), peak(&real));
        println!(
            "{:<26} {:<5} {:<5} r{:<3} ckpt {:<5} {:>4}x{:<5} {:<5} generic {:>+7.1}%  importer {:>+7.1}%",
            r.model,
            r.mode,
            r.finetune,
            r.lora_rank.unwrap_or(0),
            r.ckpt,
            r.batch,
            r.seq,
            r.attn.as_deref().unwrap_or("sdpa"),
            100.0 * g,
            100.0 * i
        );
        let family = families.entry(real.architecture.clone()).or_default();
        family.0.push(g.abs());
        family.1.push(i.abs());
        all.push(g.abs());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let stats = |e: &[f64]| {
        let mut e = e.to_vec();
        e.sort_by(f64::total_cmp);
        (100.0 * e[e.len() / 2], 100.0 * e[e.len() - 1])
    };
    println!(
        "| family | configurations | generic median | generic worst | importer median | importer worst |"
    );
    for (family, (g, i)) in &families {
        let ((gm, gw), (im, iw)) = (stats(g), stats(i));
        println!("| {family} | {} | {gm:.1} % | {gw:.1} % | {im:.1} % | {iw:.1} % |", g.len());
    }
    for (name, built) in &models {
        if let Err(refusal) = built {
            println!("refused: {name}: {refusal}");
        }
    }
    let (median, worst) = stats(&all);
    println!("all: {} configurations, median {median:.1} %, worst {worst:.1} %", all.len());
    assert!(all.len() >= generic::TRACED_CONFIGURATIONS, "fewer configurations than the label counts");
    assert!(families.len() >= generic::TRACED_FAMILIES, "fewer families than the label counts");
    assert!(median <= generic::TRACED_MEDIAN_PERCENT + 0.05, "median {median:.2} % past the stated");
    assert!(worst <= generic::TRACED_WORST_PERCENT + 0.05, "worst {worst:.2} % past the stated");
}
