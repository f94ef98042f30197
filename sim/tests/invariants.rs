//! The invariants ARCHITECTURE.md states for every estimate, checked over every built-in model
//! in inference and training: per device, allocated ≤ reserved ≤ device-used (PyTorch's
//! caching allocator reserves what it allocates, and `nvidia-smi` adds the CUDA context), and
//! the same inputs give the same figures; a sweep over shapes, which resolves a configuration
//! once, gives every shape the figures of a whole estimate.

use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, catalog};
use vramplan_sim::estimate::estimate_within;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Workload};
use vramplan_sim::{Placement, Sweep, Target, estimate};

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

/// What the solver charges a device for `units`: every unit's resident and peak bytes, and the
/// largest transient once (as `Problem::device_bytes` counts a GPU, less its fixed bytes).
fn charged<'a>(units: impl Iterator<Item = &'a vramplan_sim::charges::UnitCharge> + Clone) -> u64 {
    units.clone().map(|u| u.resident_bytes + u.peak_bytes).sum::<u64>()
        + units.map(|u| u.transient_bytes).max().unwrap_or(0)
}

/// The most allocations over 1 MiB (the large pool's, the only ones the allocator may leave a
/// remainder unsplit in) live at once on GPU `device`.
fn most_live_large_allocations(ops: &[vramplan_sim::program::Op], device: u32) -> u64 {
    use vramplan_sim::program::Op;
    let mut large = std::collections::BTreeSet::new();
    let mut most = 0;
    for op in ops {
        match op {
            Op::Alloc(a) if a.device == device && a.bytes > 1 << 20 => {
                large.insert(a.id);
                most = most.max(large.len());
            }
            Op::Free(id) => {
                large.remove(id);
            }
            _ => {}
        }
    }
    most as u64
}

/// The solver's charges are read off the step program the replay runs: on one GPU, the replay's
/// peak of live tensors never exceeds what the charges add up to (every unit's resident and peak
/// bytes, the largest transient, the cuBLAS workspace), and never falls below what the floors
/// add up to (with the workspace), nor below the steady holdings at any unit's run (the
/// others' lasting bytes and the running unit's own). The sum is looser where units reach their peaks at different
/// moments (printed).
#[test]
fn charges_bound_the_replay_on_one_gpu_for_every_built_in() {
    use vramplan_sim::charges::unit_charges;
    use vramplan_sim::program::blas_workspaces;
    let hardware = hardware::load("h100-80gb").expect("profile");
    let major = hardware.devices[0].compute_capability.major;
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut loosest = (0.0f64, String::new());
    let mut ratios = Vec::new();
    let mut full_finetune = Workload {
        mode: Mode::Train,
        batch: 1,
        seq: 256,
        grad_checkpointing: GradCheckpointing::Off,
        ..Workload::default()
    };
    full_finetune.switches.keep_gradients = false;
    let mut cases = workloads();
    cases.push(("full fine-tune", full_finetune));
    for name in catalog::builtin_names() {
        let model = model::load(name, ImportOptions::default()).expect("built-in");
        for (label, workload) in &cases {
            let Ok(replayed) = estimate(&model, &hardware, workload, &Placement::single(0)) else { continue };
            let charges = unit_charges(&model, &hardware, workload);
            let workspace: u64 = blas_workspaces(&model, major, workload).iter().sum();
            let bound = charged(charges.units.iter()) + workspace;
            let allocated = replayed.devices[0].peak_allocated_bytes;
            let floor: u64 = charges.units.iter().map(|u| u.floor_bytes).sum::<u64>() + workspace;
            checked += 1;
            if allocated > bound {
                failures.push(format!("{name} {label}: replay {allocated} B above the charges' {bound} B"));
            }
            if floor > allocated {
                failures
                    .push(format!("{name} {label}: the floors' {floor} B above the replay's {allocated} B"));
            }
            // At each unit's run: the others' steady holdings and its own running ones.
            let throughout: u64 = charges.units.iter().map(|u| u.steady.throughout_bytes).sum();
            let steady = charges
                .units
                .iter()
                .map(|u| throughout - u.steady.throughout_bytes + u.steady.running_bytes)
                .max()
                .unwrap_or(0)
                + workspace;
            if steady > allocated {
                failures.push(format!(
                    "{name} {label}: the steady holdings' {steady} B above the replay's {allocated} B"
                ));
            }
            let ratio = bound as f64 / allocated.max(1) as f64;
            ratios.push(ratio);
            if ratio > loosest.0 {
                loosest = (ratio, format!("{name} {label}"));
            }
        }
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "{checked} cases; the charges are {:.2} % above the replay at the median, at most {:.1} % ({})",
        100.0 * (ratios.get(ratios.len() / 2).copied().unwrap_or(1.0) - 1.0),
        100.0 * (loosest.0 - 1.0),
        loosest.1
    );
    assert!(checked >= 150, "only {checked} cases checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// On several GPUs the charges miss two things (ARCHITECTURE.md, `charges.rs`): the hidden
/// states in flight at a boundary, and the remainders the allocator leaves unsplit differently
/// when a device holds fewer allocations (at most 1 MiB each live). Past those, a device's replay
/// stays within the charges of the units it holds: over every built-in, layers split evenly
/// over 2, 3 and 4 GPUs.
#[test]
fn charges_bound_each_gpu_of_an_even_split_within_what_they_miss() {
    use vramplan_sim::charges::unit_charges;
    use vramplan_sim::program::{blas_workspaces, step_program};
    let hardware = hardware::load("h100-80gb-x8").expect("profile");
    let major = hardware.devices[0].compute_capability.major;
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in catalog::builtin_names() {
        let model = model::load(name, ImportOptions::default()).expect("built-in");
        for (label, workload) in workloads() {
            let charges = unit_charges(&model, &hardware, &workload);
            for gpus in [2, 3, 4] {
                let placement = Placement::even_layers(&model, gpus);
                let Ok(replayed) = estimate(&model, &hardware, &workload, &placement) else { continue };
                let program = step_program(&model, &hardware, &workload, &placement);
                for d in &replayed.devices {
                    let held = charges
                        .units
                        .iter()
                        .zip(&program.units)
                        .filter(|(_, u)| u.device == Some(d.id))
                        .map(|(c, _)| c);
                    let bound = charged(held)
                        + blas_workspaces(&model, major, &workload).iter().sum::<u64>()
                        + charges.handoff_bytes
                        + most_live_large_allocations(&program.ops, d.id) * (1 << 20);
                    checked += 1;
                    if d.peak_allocated_bytes > bound {
                        failures.push(format!(
                            "{name} {label} on {gpus} GPUs, GPU {}: replay {} B above {bound} B",
                            d.id, d.peak_allocated_bytes
                        ));
                    }
                }
            }
        }
    }
    assert!(checked >= 300, "only {checked} devices checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The shapes a sweep is held to: batch and sequence up and down from the workload's, and a
/// prompt shorter than the context.
fn shapes(workload: &Workload) -> Vec<Workload> {
    let at = |batch: u64, seq: u64, prompt: Option<u64>| Workload { batch, seq, prompt, ..workload.clone() };
    vec![at(1, 128, None), at(3, 1000, None), at(8, 4096, None), at(2, 3000, Some(700)), workload.clone()]
}

#[test]
fn a_sweep_gives_every_shape_the_figures_of_a_whole_estimate() {
    let one = hardware::load("h100-80gb").expect("profile");
    let eight = hardware::load("h100-80gb-x8").expect("profile");
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples");
    let mut models: Vec<String> = catalog::builtin_names().iter().map(|n| n.to_string()).collect();
    for example in ["timeseries-transformer.yaml", "graph-network.yaml", "xlnet-memory-mixture.yaml"] {
        models.push(examples.join(example).to_string_lossy().into_owned());
    }
    let mut differences = Vec::new();
    let mut checked = 0;
    for name in &models {
        let model = model::load(name, ImportOptions::default()).expect("model");
        // One GPU; layers over eight; and in inference half the layers offloaded to the CPU.
        let mut offloaded = Placement::even_layers(&model, 2).entries().to_vec();
        for (_, target) in offloaded.iter_mut() {
            if *target == Target::Gpu(1) {
                *target = Target::Cpu;
            }
        }
        let placements = [
            (&one, Placement::single(0)),
            (&eight, Placement::even_layers(&model, 8)),
            (&one, Placement::from_entries(offloaded)),
        ];
        for (label, workload) in workloads() {
            for (hw, placement) in &placements {
                let sweep = Sweep::new(&model, hw, &workload, placement.clone(), 0.1);
                for shape in shapes(&workload) {
                    let whole = estimate_within(&model, hw, &shape, placement, 0.1);
                    if sweep.estimate(&shape) != whole {
                        differences.push(format!(
                            "{name} {label} on {} at batch {} seq {} prompt {:?}",
                            hw.name, shape.batch, shape.seq, shape.prompt
                        ));
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 500, "only {checked} shapes checked");
    assert!(differences.is_empty(), "{} of {checked} differ:\n{}", differences.len(), differences.join("\n"));
}
