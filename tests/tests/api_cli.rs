//! The API the Python binding calls answers what the command line prints: for one case of
//! every command, `vramplan-api`'s result serialised is the CLI's `--json` output byte for byte
//! (the solver's wall-clock seconds set aside), and its outcome is the CLI's exit code.

use std::path::PathBuf;
use vramplan_api::*;
use vramplan_tests::vramplan;

/// `text` with every `"seconds": N` set to 0 (the solver's and the probes' wall clock).
fn untimed(text: &str) -> String {
    text.lines()
        .map(|line| match line.split_once("\"seconds\": ") {
            Some((head, rest)) => {
                let tail =
                    rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == 'e' || c == '-');
                format!("{head}\"seconds\": 0{tail}")
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The CLI's `--json` for `args`, and its exit code.
fn cli(args: &[&str]) -> (String, i32) {
    let out = vramplan(args);
    assert!(out.code != EXIT_BAD_INPUT, "{args:?}: {}", out.stderr);
    (out.stdout, out.code)
}

/// The API's JSON as the CLI prints it (one line end).
fn printed(json: String) -> String {
    json + "\n"
}

fn inputs(model: &str, hardware: &str, flags: WorkloadFlags) -> Inputs {
    Inputs { model: ModelSource::Spec(model.into()), hardware: hardware.into(), flags, ..Inputs::default() }
}

fn inference(batch: u64, seq: u64) -> WorkloadFlags {
    WorkloadFlags { mode: Some("inference".into()), batch: Some(batch), seq: Some(seq), ..Default::default() }
}

#[test]
fn inspect_and_profiles() {
    let summary = inspect(&InspectRequest { model: "gpt2".into(), ..InspectRequest::default() }).unwrap();
    assert_eq!(printed(json_text(&summary)), cli(&["inspect", "gpt2", "--json"]).0);
    assert_eq!(printed(json_text(&profiles().unwrap())), cli(&["profiles", "--json"]).0);
    assert_eq!(printed(json_text(&profile("t4x2").unwrap())), cli(&["profiles", "show", "t4x2", "--json"]).0);
}

#[test]
fn estimate_split_over_two_gpus_and_on_a_map() {
    let request = EstimateRequest {
        inputs: inputs("pythia-1b", "t4x2", inference(4, 1024)),
        ..EstimateRequest::default()
    };
    let result = estimate(&request).unwrap();
    let (text, code) = cli(&[
        "estimate",
        "pythia-1b",
        "--hardware",
        "t4x2",
        "--mode",
        "inference",
        "--batch",
        "4",
        "--seq",
        "1024",
        "--json",
    ]);
    assert_eq!(printed(result.to_json()), text);
    assert_eq!(result.outcome().exit_code(), code);

    let folder = tempfile::tempdir().unwrap();
    let map = folder.path().join("map.json");
    std::fs::write(&map, r#"{"": 0}"#).unwrap();
    let request = EstimateRequest {
        inputs: inputs("gpt2", "t4", WorkloadFlags::default()),
        map: MapSource { device_map: Some(DeviceMapSource::File(map.clone())), ..MapSource::default() },
    };
    let result = estimate(&request).unwrap();
    let (text, code) =
        cli(&["estimate", "gpt2", "--hardware", "t4", "--device-map", map.to_str().unwrap(), "--json"]);
    assert_eq!(printed(result.to_json()), text);
    assert_eq!(result.outcome().exit_code(), code);
}

#[test]
fn plan_that_fits_and_its_map() {
    let request =
        PlanRequest { inputs: inputs("pythia-1b", "t4x2", WorkloadFlags::default()), ..Default::default() };
    let result = plan(&request).unwrap();
    let (text, code) = cli(&["plan", "pythia-1b", "--hardware", "t4x2", "--json"]);
    assert_eq!(untimed(&printed(result.to_json())), untimed(&text));
    assert_eq!(result.outcome().exit_code(), code);
    assert_eq!(code, 0);
}

#[test]
fn plan_that_does_not_fit_with_its_remedies() {
    let request = PlanRequest {
        inputs: inputs("llama-2-70b", "t4", WorkloadFlags::default()),
        solve: SolveOptions { no_offload: true, ..SolveOptions::default() },
        ..PlanRequest::default()
    };
    let result = plan(&request).unwrap();
    let (text, code) = cli(&["plan", "llama-2-70b", "--hardware", "t4", "--no-offload", "--json"]);
    assert_eq!(untimed(&printed(result.to_json())), untimed(&text));
    assert_eq!(result.outcome().exit_code(), code);
    assert_eq!(code, EXIT_NEGATIVE);
}

#[test]
fn check_of_a_map() {
    let folder = tempfile::tempdir().unwrap();
    let map = folder.path().join("map.json");
    std::fs::write(&map, r#"{"transformer": 0, "lm_head": "cpu"}"#).unwrap();
    let request = CheckRequest {
        device_map: DeviceMapSource::File(map.clone()),
        inputs: inputs("gpt2", "t4", inference(1, 512)),
        target: "accelerate".into(),
    };
    let result = check(&request).unwrap();
    let (text, code) = cli(&[
        "check",
        map.to_str().unwrap(),
        "gpt2",
        "--hardware",
        "t4",
        "--mode",
        "inference",
        "--batch",
        "1",
        "--seq",
        "512",
        "--json",
    ]);
    assert_eq!(printed(result.to_json()), text);
    assert_eq!(result.outcome().exit_code(), code);
}

#[test]
fn whatif_max_batch_and_a_grid() {
    let request = WhatifRequest {
        query: Query::MaxBatch,
        inputs: inputs("pythia-1b", "t4", inference(1, 2048)),
        ..WhatifRequest::default()
    };
    let result = whatif(&request).unwrap();
    let (text, code) = cli(&[
        "whatif",
        "max-batch",
        "pythia-1b",
        "--hardware",
        "t4",
        "--mode",
        "inference",
        "--seq",
        "2048",
        "--json",
    ]);
    assert_eq!(printed(result.to_json()), text);
    assert_eq!(result.outcome().exit_code(), code);

    let request = WhatifRequest {
        query: Query::Grid,
        inputs: inputs("gpt2", "t4", inference(1, 512)),
        axes: GridAxes { batch: Some("1..8".into()), seq: Some("512,1024".into()), ..GridAxes::default() },
        ..WhatifRequest::default()
    };
    let result = whatif(&request).unwrap();
    let (text, code) = cli(&[
        "whatif",
        "grid",
        "gpt2",
        "--hardware",
        "t4",
        "--mode",
        "inference",
        "--batch",
        "1..8",
        "--seq",
        "512,1024",
        "--json",
    ]);
    assert_eq!(printed(result.to_json()), text);
    assert_eq!(result.outcome().exit_code(), code);
}

#[test]
fn plot_and_report_bytes_are_the_files_the_cli_writes() {
    let folder = tempfile::tempdir().unwrap();
    let svg = folder.path().join("plot.svg");
    vramplan(&["plot", "breakdown", "gpt2", "--hardware", "t4", "-o", svg.to_str().unwrap()]);
    let request = PlotRequest::new(PlotKind::Breakdown, inputs("gpt2", "t4", WorkloadFlags::default()));
    assert_eq!(plot(&request).unwrap(), std::fs::read(&svg).unwrap());

    let md = folder.path().join("report.md");
    vramplan(&["report", "gpt2", "--hardware", "t4", "-o", md.to_str().unwrap()]);
    let request = ReportRequest {
        inputs: inputs("gpt2", "t4", WorkloadFlags::default()),
        output: md.clone(),
        ..ReportRequest::default()
    };
    let written = report(&request).unwrap();
    assert_eq!(written.document.1, std::fs::read_to_string(&md).unwrap());
    for (path, svg) in &written.drawings {
        assert_eq!(*svg, std::fs::read_to_string(path).unwrap(), "{path:?}");
    }
    assert!(written.drawings.iter().all(|(p, _)| p.parent() == Some(folder.path())));
    let _: &PathBuf = &written.document.0;
}

#[test]
fn validate_static_finding() {
    // GPT-2's tied lm_head and wte on two devices: accelerate's tie rule is broken, found
    // statically, and nothing runs.
    let folder = tempfile::tempdir().unwrap();
    let map = folder.path().join("map.json");
    std::fs::write(&map, r#"{"transformer": 0, "lm_head": 1}"#).unwrap();
    let request = ValidateRequest::new(PlanSource::Map(Box::new(MapPlan {
        model: "gpt2".into(),
        device_map: DeviceMapSource::File(map.clone()),
        hardware: "t4x2".into(),
        workload: None,
        flags: inference(1, 128),
        target: "accelerate".into(),
    })));
    let result = validate(&request).unwrap();
    let out = vramplan(&[
        "validate",
        "gpt2",
        "--device-map",
        map.to_str().unwrap(),
        "--hardware",
        "t4x2",
        "--mode",
        "inference",
        "--batch",
        "1",
        "--seq",
        "128",
        "--json",
    ]);
    assert_eq!(printed(result.to_json()), out.stdout, "{}", out.stderr);
    assert_eq!(result.outcome().exit_code(), out.code);
}
