//! The simulator against the reference tracer of the real runtime: every configuration that
//! `scripts/reference/trace.py` ran (transformers + PEFT + bitsandbytes under PyTorch's
//! FakeTensorMode, each storage followed from creation to death by PyTorch's MemTracker; the
//! configurations and library versions are in `fixtures/reference/trace/v5.json`) is estimated
//! here and its peak of live tensor bytes compared with the tracer's.
//!
//! The tracer runs CPU kernels and no CUDA library: the estimate's cuBLAS workspace, which
//! PyTorch allocates on a GPU and the CPU never makes, is left out of the comparison. Nothing
//! else is adjusted.

mod support;

use support::{compare, fixture, gib};
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::Workload;

#[test]
fn estimates_follow_the_traced_runtime() {
    let fixture = fixture("v5.json");
    let hardware = hardware::load("h100-80gb").expect("profile");
    let mut errors = Vec::new();
    let (mut training, mut inference) = (Vec::new(), Vec::new());
    // Held-out sets by number, each with what it was then used for.
    let mut held_out: Vec<(u32, &str, Vec<f64>)> = vec![
        (1, "first set (then used: eager softmax)", Vec::new()),
        (2, "second set (then used: prefill's working set)", Vec::new()),
        (3, "third set", Vec::new()),
    ];
    let mut skipped = Vec::new();
    let mut task_heads: Vec<(String, f64)> = Vec::new();
    println!("tracer: {}", fixture.versions);
    println!("{:<48} {:>10} {:>10} {:>8}  tracer's peak at", "configuration", "tracer", "estimate", "error");
    for r in &fixture.records {
        let Ok(traced) = r.traced_peak().map_err(|line| skipped.push(line)) else { continue };
        let c = compare(&r.built_model(), &hardware, &r.workload(), traced, &r.label());
        let error = c.error;
        let at = r.peak_where.as_ref().map(|w| w.to_string()).unwrap_or_default();
        println!(
            "{:<48} {:>10.3} {:>10.3} {:>7.1}%  {} / ours: {}",
            r.label(),
            gib(traced),
            gib(c.ours),
            100.0 * error,
            at,
            c.peak_at
        );
        if r.cls.is_some() {
            // A task head's rows (the first incident's XLNet): each held within 3 %.
            task_heads.push((r.label(), error));
            continue;
        }
        if r.held_out {
            let set = r.set.unwrap_or(1);
            match held_out.iter_mut().find(|h| h.0 == set) {
                Some(h) => h.2.push(error.abs()),
                None => panic!("{}: held-out set {set} has no description here", r.label()),
            }
            continue;
        }
        errors.push(error.abs());
        if r.mode == "train" { &mut training } else { &mut inference }.push(error.abs());
    }
    for s in &skipped {
        println!("{s}");
    }
    let stats = |e: &mut Vec<f64>| {
        e.sort_by(f64::total_cmp);
        (e[e.len() / 2], e[e.len() - 1])
    };
    let (median, worst) = stats(&mut errors);
    let (train_median, train_worst) = stats(&mut training);
    let (infer_median, infer_worst) = stats(&mut inference);
    println!(
        "{} configurations: median |error| {:.1}%, worst {:.1}%",
        errors.len(),
        100.0 * median,
        100.0 * worst
    );
    println!(
        "  training: {} configurations, median {:.1}%, worst {:.1}%",
        training.len(),
        100.0 * train_median,
        100.0 * train_worst
    );
    println!(
        "  inference: {} configurations, median {:.1}%, worst {:.1}%",
        inference.len(),
        100.0 * infer_median,
        100.0 * infer_worst
    );
    for (_, what, errors) in held_out.iter_mut().filter(|h| !h.2.is_empty()) {
        let (m, w) = stats(errors);
        println!(
            "  held out, {what}: {} configurations, median {:.1}%, worst {:.1}%",
            errors.len(),
            100.0 * m,
            100.0 * w
        );
    }
    let off: Vec<String> = task_heads
        .iter()
        .filter(|(_, e)| e.abs() > 0.03)
        .map(|(label, e)| format!("{label}: {:+.1}%", 100.0 * e))
        .collect();
    assert!(task_heads.len() >= 5, "{} task-head rows", task_heads.len());
    assert!(off.is_empty(), "task heads off by more than 3%: {off:?}");
    assert!(errors.len() >= 60, "the matrix has {} traced configurations", errors.len());
    assert!(skipped.is_empty(), "configurations the tracer could not run: {skipped:?}");
    assert!(median <= 0.03, "median |error| {:.1}% > 3%", 100.0 * median);
    assert!(train_worst <= 0.10, "training: worst |error| {:.1}% > 10%", 100.0 * train_worst);
    assert!(infer_worst <= 0.10, "inference: worst |error| {:.1}% > 10%", 100.0 * infer_worst);
}

/// Per token, what one block keeps for backward in each traced family (full fine-tune, LoRA
/// and QLoRA at 1 × 512), to set beside the tracer's saved-tensor listing when a row differs
/// (`cargo test --test tracer -- --ignored --nocapture`).
#[test]
#[ignore = "diagnostic listing"]
fn saved_per_token_by_family() {
    let fixture = fixture("v5.json");
    let mut seen = Vec::new();
    for r in fixture.records.iter().filter(|r| r.mode == "train" && !r.ckpt) {
        if seen.contains(&(r.model.clone(), r.finetune.clone())) {
            continue;
        }
        seen.push((r.model.clone(), r.finetune.clone()));
        let model = model::load(&r.model, ImportOptions::default()).expect("built-in model");
        let workload = Workload { batch: 1, seq: 512, ..r.workload() };
        let bytes = vramplan_sim::saved_activation_bytes(&model, &workload, 1);
        println!("{:<16} {:<6} {:>10.1} B/token", r.model, r.finetune, bytes as f64 / 512.0);
    }
}
