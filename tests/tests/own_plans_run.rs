//! vramplan's own plans run on the `cpu` backend without a mismatch: every built-in model,
//! planned for two T4s and for four A100-40GB, in inference and in LoRA training where a plan
//! exists, is run through accelerate's dispatch as the cpu backend reads it, every operation
//! checking PyTorch's device rule. A plan the solver makes must never be a map the runtime
//! stops on (the cpu backend agrees with the real runtime on the recorded maps:
//! `mismatches.rs`).

use vramplan_tests::vramplan;

fn builtins() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/catalog/models");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("catalog")
        .filter_map(Result::ok)
        .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
        // A vision-language model's `NAME.preprocessor_config.json` sits beside its config.
        .filter(|name| !name.ends_with(".preprocessor_config"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_builtin_plan_runs_on_the_cpu_backend_without_a_mismatch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut ran = 0;
    for model in builtins() {
        for hardware in ["t4x2", "4xa100-40gb"] {
            for workload in [
                &["--mode", "inference", "--seq", "512"][..],
                &["--mode", "train", "--lora-rank", "16", "--lora-targets", "all-linear", "--seq", "512"][..],
            ] {
                let plan = dir.path().join(format!("{model}-{hardware}-{}.yaml", workload[1]));
                let plan = plan.display().to_string();
                let mut args = vec!["plan", model.as_str(), "--hardware", hardware];
                args.extend_from_slice(workload);
                args.extend(["--time-limit", "5", "-o", &plan]);
                let out = vramplan(&args);
                if out.code != 0 {
                    // No plan (it does not fit, or no answer in time): nothing to run.
                    assert!(matches!(out.code, 1 | 4), "{args:?}: exit {}: {}", out.code, out.stderr);
                    continue;
                }
                let out = vramplan(&["validate", &plan, "--backend", "cpu", "--json"]);
                ran += 1;
                if out.code != 0 {
                    failures.push(format!(
                        "{model} on {hardware} {}: exit {}: {}",
                        workload[1], out.code, out.stdout
                    ));
                }
            }
        }
    }
    assert!(ran >= 150, "only {ran} plans ran");
    assert!(failures.is_empty(), "{} of {ran} plans fail:\n{}", failures.len(), failures.join("\n"));
}
