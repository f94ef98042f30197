//! The simulator against the reference tracer for vision-language models with images:
//! `scripts/reference/trace_vlm.py` ran each configuration of `fixtures/reference/trace/vlm-v5.json`
//! with the real transformers (+ PEFT) under FakeTensorMode, the images' index tensors computed
//! from their real grids (versions in the file), each model the built-in or the config the record
//! carries (Llama 4 Scout with 4 text layers, so its images' share shows). Each estimate's peak of allocated bytes, less the
//! cuBLAS workspace the CPU never makes (as `support::compare` leaves it out), is held within 3 % of the
//! traced peak.

mod support;

use support::{Compared, compare, fixture};
use vramplan_profiles::hardware;

#[test]
fn vision_language_estimates_follow_the_traced_runtime() {
    let fixture = fixture("vlm-v5.json");
    let hardware = hardware::load("h200").expect("profile");
    println!("tracer: {}", fixture.versions);
    let mut failures = Vec::new();
    for r in &fixture.records {
        let Ok(traced) = r.traced_peak().map_err(|line| failures.push(line)) else { continue };
        let model = r.built_model();
        let Compared { error, peak_at, .. } = compare(&model, &hardware, &r.workload(), traced, &r.label());
        println!("{:<70} {:>8.1}% (ours at {peak_at})", r.label(), 100.0 * error);
        if error.abs() > 0.03 {
            failures.push(format!("{}: {:+.1}%", r.label(), 100.0 * error));
        }
    }
    assert!(failures.is_empty(), "past 3 %:\n{}", failures.join("\n"));
}
