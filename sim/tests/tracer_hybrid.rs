//! The simulator against the reference tracer for the hybrid attention + state-space family
//! (Falcon-H1): the rows of `fixtures/reference/trace/v5.json` whose model is a built-in with
//! Mamba-2 mixers (`LayerFacts::ssm`), traced by `scripts/reference/trace.py` (transformers'
//! torch path of the mixer, as it runs without the `mamba_ssm` / `causal_conv1d` kernels; the
//! versions in the file). Each estimate's peak of allocated bytes, less the cuBLAS workspace
//! the CPU never makes (as `support::compare` leaves it out), is held within 3 % of the traced peak.

mod support;

use support::{compare, fixture, gib};
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};

#[test]
fn hybrid_estimates_follow_the_traced_runtime() {
    let fixture = fixture("v5.json");
    let hardware = hardware::load("h100-80gb").expect("profile");
    println!("tracer: {}", fixture.versions);
    let (mut rows, mut failures) = (0, Vec::new());
    for r in &fixture.records {
        // Built-ins only (a row may name a model another helper's importer builds).
        let Ok(model) = model::load(&r.model, ImportOptions::default()) else { continue };
        if !model.facts.layers.iter().any(|l| l.ssm.is_some()) {
            continue;
        }
        rows += 1;
        let Ok(traced) = r.traced_peak().map_err(|line| failures.push(line)) else { continue };
        let c = compare(&model, &hardware, &r.workload(), traced, &r.label());
        let error = c.error;
        println!(
            "{:<56} {:>8.3} {:>8.3} GiB {:>7.1}% (ours at {})",
            r.label(),
            gib(traced),
            gib(c.ours),
            100.0 * error,
            c.peak_at
        );
        if error.abs() > 0.03 {
            failures.push(format!("{}: {:+.1}%", r.label(), 100.0 * error));
        }
    }
    assert!(rows >= 2, "{rows} hybrid rows in the fixture: a training and an inference row expected");
    assert!(failures.is_empty(), "past 3 %:\n{}", failures.join("\n"));
}
