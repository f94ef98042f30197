//! The loading rules every accelerate map must keep, checked over every built-in model in both
//! namings (the reference load test runs the real runtime on a subset; this covers all):
//!
//! - keys are disjoint prefixes: transformers 5.x leaves a parent's weights on the meta device
//!   when its key sits beside its children's (issue 9, XLNet and GPTBigCode);
//! - every state-dict tensor is covered, tied aliases included (T5's `encoder.embed_tokens`);
//! - every tied group is on one device (BERT's `cls.predictions`);
//! - nothing goes to `cpu` or `disk` while the GPUs have room (8 × 80 GB for inference of any
//!   built-in but the largest, whose figures are read off the plan itself).

use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming, catalog};
use vramplan_sim::device_map::unplaced;
use vramplan_sim::placement::{Placement, covers};
use vramplan_sim::workload::{Mode, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::plan::{Settings, plan};

fn breaches(model: &ModelDescription, map: &[(String, vramplan_solver::Target)]) -> Vec<String> {
    let mut out = Vec::new();
    for (a, _) in map {
        for (b, _) in map {
            if a != b && covers(a, b) {
                out.push(format!("`{a}` beside its descendant `{b}`"));
            }
        }
    }
    let placement = Placement::from_entries(map.to_vec());
    let left = unplaced(model, &placement);
    if !left.tensors.is_empty() {
        out.push(format!("on no device: {:?}", &left.tensors[..left.tensors.len().min(3)]));
    }
    for group in model.tied_groups() {
        let devices: std::collections::BTreeSet<_> =
            group.iter().filter_map(|t| placement.target_of(t)).collect();
        if devices.len() > 1 {
            out.push(format!("tied {group:?} on {devices:?}"));
        }
    }
    out
}

#[test]
fn every_built_in_map_loads_by_the_rules_in_both_namings() {
    let hardware = hardware::load("h100-80gb-x8").expect("profile");
    let workload = Workload {
        mode: Mode::Inference,
        batch: 1,
        seq: 1024,
        weight_dtype: Some(vramplan_profiles::DType::BF16),
        ..Workload::default()
    };
    let mut failures = Vec::new();
    let mut planned = 0;
    for name in catalog::builtin_names() {
        for (naming, runtime) in [(Naming::V5, Runtime::Accelerate), (Naming::V4, Runtime::AccelerateV4)] {
            let model = model::load(name, ImportOptions { naming }).expect("built-in");
            let request = Request::new(runtime);
            let Ok(result) = plan(&model, &hardware, &workload, &request, &Settings::default()) else {
                failures.push(format!("{name} ({naming:?}): no plan"));
                continue;
            };
            if !result.feasible {
                continue;
            }
            planned += 1;
            for breach in breaches(&model, &result.device_map) {
                failures.push(format!("{name} ({naming:?}): {breach}"));
            }
            // Offloaded bytes only where the GPUs are full: no GPU may have room left for all
            // of them.
            if result.offloaded_bytes > 0 {
                let room = result
                    .devices
                    .iter()
                    .filter_map(|d| {
                        d.estimate.as_ref().map(|e| d.limit_bytes.saturating_sub(e.peak_reserved_bytes))
                    })
                    .max()
                    .unwrap_or(0);
                let host: Vec<&String> = result
                    .device_map
                    .iter()
                    .filter(|(_, t)| !matches!(t, vramplan_solver::Target::Gpu(_)))
                    .map(|(k, _)| k)
                    .collect();
                if room > result.offloaded_bytes {
                    failures.push(format!(
                        "{name} ({naming:?}): {} bytes offloaded ({host:?}) while a GPU has {room} bytes free",
                        result.offloaded_bytes
                    ));
                }
            }
        }
    }
    assert!(planned >= 100, "only {planned} plans fit");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
