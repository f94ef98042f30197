//! `scripts/gpu-check` run where there is no GPU, as CI is: it must still plan every case, run
//! each backend (which answers "no device here", exit 3), and write its dataset with the
//! prediction of every plan GPU, so that on a lent GPU the one prepared run cannot fail on the
//! script itself.

use std::process::Command;

#[test]
fn gpu_check_writes_its_dataset_without_a_gpu() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().expect("temp dir");
    // Two cases: one on the GPU's own profile, one plan for two T4s folded onto it.
    let cases = dir.path().join("cases");
    std::fs::write(
        &cases,
        "# test cases\n\
         gpt2-infer gpt2 gpu cuda+torch --mode inference --batch 2 --seq 256 --dtype bf16\n\
         gpt2-t4x2 gpt2 t4x2 cuda --mode train --batch 2 --seq 256 --dtype fp32\n",
    )
    .expect("write cases");
    let out = dir.path().join("out");
    let status = Command::new(root.join("scripts/gpu-check"))
        .arg(&out)
        .env("VRAMPLAN_BIN", env!("CARGO_BIN_EXE_vramplan"))
        .env("VRAMPLAN_GPU_CHECK_CASES", &cases)
        .env("VRAMPLAN_GPU_CHECK_HARDWARE", "h100-80gb")
        // No GPU and no torch here: every run answers "unavailable".
        .env("VRAMPLAN_PYTHON", "python3")
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run scripts/gpu-check");
    let log = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(0), "{log}\n{}", String::from_utf8_lossy(&status.stderr));
    // Where this machine has a GPU, the profile is its own; the test is about the script.
    let json = std::fs::read_dir(&out)
        .expect("out dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a <gpu>.json in the output");
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("read dataset"))
            .expect("dataset is JSON");
    let cases = data["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    assert_eq!(cases[1]["hardware"], "t4x2");
    let runs = |i: usize| cases[i]["runs"].as_array().expect("runs").clone();
    assert_eq!(runs(0).len(), 2, "cuda and torch for the first case");
    assert_eq!(runs(1).len(), 1, "cuda only for the second");
    for run in runs(0).iter().chain(runs(1).iter()) {
        // Each backend ran and answered: measured where a GPU is, else exit 3 with the reason.
        let exit = run["exit"].as_str().expect("exit");
        assert!(exit == "0" || exit == "3", "{run}");
        assert!(run["outcome"]["kind"].is_string(), "{run}");
    }
    // The folded plan has two plan GPUs, each with its prediction.
    let devices = runs(1)[0]["devices"].as_array().expect("devices").clone();
    assert_eq!(devices.len(), 2, "{}", runs(1)[0]);
    for d in &devices {
        assert!(d["predicted"]["allocated"].as_u64().is_some_and(|b| b > 100_000_000), "{d}");
    }
    // The script validator's programs, each run fake and real (here both answer: exit 3, a
    // Python without torch).
    let scripts = data["scripts"].as_array().expect("scripts");
    assert_eq!(scripts.len(), 8, "{scripts:?}");
    for s in scripts {
        for mode in ["fake", "real"] {
            let exit = s[mode]["exit"].as_str().expect("exit");
            assert!(exit == "0" || exit == "1" || exit == "3", "{s}");
        }
    }
    assert!(std::fs::metadata(out.join("gpu-check.tar.gz")).is_ok_and(|m| m.len() > 0));
}
