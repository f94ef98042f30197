//! The invariants ARCHITECTURE.md states for every estimate, checked over every built-in model
//! in inference and training: per device, allocated ≤ reserved ≤ device-used (PyTorch's
//! caching allocator reserves what it allocates, and `nvidia-smi` adds the CUDA context), and
//! the same inputs give the same figures.

use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, catalog};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Workload};
use vramplan_sim::{Placement, estimate};

fn workloads() -> Vec<(&'static str, Workload)> {
    vec![
        ("inference", Workload { mode: Mode::Inference, batch: 2, seq: 1024, ..Workload::default() }),
        (
            "lora training",
            Workload {
                mode: Mode::Train,
                batch: 1,
                seq: 512,
                grad_checkpointing: GradCheckpointing::Full,
                finetune: Finetune::Lora { rank: 8, alpha: 16, targets: Vec::new() },
                ..Workload::default()
            },
        ),
    ]
}

#[test]
fn allocated_within_reserved_within_device_used_for_every_built_in() {
    let hardware = hardware::load("h100-80gb-x8").expect("profile");
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in catalog::builtin_names() {
        let model = model::load(name, ImportOptions::default()).expect("built-in");
        let placement = Placement::even_layers(&model, 8);
        for (label, workload) in workloads() {
            let first = match estimate(&model, &hardware, &workload, &placement) {
                Ok(first) => first,
                Err(e) => {
                    failures.push(format!("{name} {label}: {e}"));
                    continue;
                }
            };
            let again = estimate(&model, &hardware, &workload, &placement).expect("the same inputs");
            if first.devices != again.devices {
                failures.push(format!("{name} {label}: two runs differ"));
            }
            for d in &first.devices {
                checked += 1;
                if !(d.peak_allocated_bytes <= d.peak_reserved_bytes
                    && d.peak_reserved_bytes <= d.device_used_bytes)
                {
                    failures.push(format!(
                        "{name} {label} GPU {}: allocated {} reserved {} device-used {}",
                        d.id, d.peak_allocated_bytes, d.peak_reserved_bytes, d.device_used_bytes
                    ));
                }
            }
        }
    }
    assert!(checked >= 500, "only {checked} devices checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
