//! Every command called through the API, as the Python binding will call it: on built-in models
//! whose sizes come from their published configs (Pythia-1B: 16 layers of GPTNeoX, ~1.01 B
//! parameters; GPT-2: 124 M), with the answers checked against those facts and against each
//! other (a config given as text, or a description already built, gives what the name gives).
//! That the JSON equals the command line's byte for byte is `tests/tests/api_cli.rs`.

use std::path::PathBuf;
use vramplan_api::*;
use vramplan_profiles::model::{ImportOptions, catalog};
use vramplan_sim::input::WorkloadFlags;

/// `model` on `hardware`, the default workload.
fn inputs(model: &str, hardware: &str) -> Inputs {
    Inputs { model: ModelSource::Spec(model.into()), hardware: hardware.into(), ..Inputs::default() }
}

/// Inference at `batch` × `seq`.
fn inference(model: &str, hardware: &str, batch: u64, seq: u64) -> Inputs {
    let flags = WorkloadFlags {
        mode: Some("inference".into()),
        batch: Some(batch),
        seq: Some(seq),
        ..Default::default()
    };
    Inputs { flags, ..inputs(model, hardware) }
}

#[test]
fn plan_places_every_layer_of_pythia_on_two_t4s() {
    let request = PlanRequest { inputs: inputs("pythia-1b", "t4x2"), ..PlanRequest::default() };
    let result = plan(&request).expect("plan");
    assert_eq!(result.outcome(), Outcome::Positive);
    assert_eq!(result.outcome().exit_code(), 0);
    let map = &result.result.device_map;
    // The published config: 16 hidden layers, each placed once, in order, over both GPUs.
    for layer in 0..16 {
        let key = format!("gpt_neox.layers.{layer}");
        assert_eq!(map.iter().filter(|(k, _)| *k == key).count(), 1, "{key}: {map:?}");
    }
    let gpus: std::collections::BTreeSet<_> = map.iter().map(|(_, t)| *t).collect();
    assert_eq!(gpus.len(), 2, "one copy split over both T4s: {map:?}");
    assert!(result.baseline.is_some(), "accelerate's map beside it");
    assert!(result.export.is_none(), "no -o, no export");
    let json: serde_json::Value = serde_json::from_str(&result.to_json()).expect("JSON");
    assert_eq!(json["verdict"], "fits");
    assert_eq!(json["device_map"].as_object().map(|m| m.len()), Some(map.len()));
}

#[test]
fn plan_renders_the_export_its_file_name_asks_for() {
    let request = PlanRequest {
        inputs: inputs("pythia-1b", "t4x2"),
        output: Some("plan.yaml".into()),
        ..PlanRequest::default()
    };
    let result = plan(&request).expect("plan");
    let (format, export) = result.export.expect("an export");
    assert_eq!(format, vramplan_solver::export::Format::Yaml);
    assert!(export.text.contains("model: pythia-1b"), "{}", export.text);
    let request = PlanRequest { output: Some("map.json".into()), ..request };
    let (format, export) = plan(&request).expect("plan").export.expect("an export");
    assert_eq!(format, vramplan_solver::export::Format::Accelerate);
    let map: serde_json::Value = serde_json::from_str(&export.text).expect("accelerate's JSON");
    assert_eq!(map["lm_head"], serde_json::json!(1));
}

#[test]
fn a_plan_that_cannot_fit_is_negative_with_remedies() {
    // Llama-2-70B in bf16 holds some 138 GB of weights: no training step fits one T4's 16 GB.
    let request = PlanRequest {
        inputs: inputs("llama-2-70b", "t4"),
        solve: SolveOptions { no_offload: true, ..SolveOptions::default() },
        ..PlanRequest::default()
    };
    let result = plan(&request).expect("plan");
    assert_eq!(result.outcome(), Outcome::Negative);
    assert_eq!(result.outcome().exit_code(), EXIT_NEGATIVE);
    assert!(result.explanation.is_some(), "why, and the remedies");
}

#[test]
fn a_bad_hardware_name_is_an_input_error_with_its_fix() {
    for run in [
        |i: Inputs| estimate(&EstimateRequest { inputs: i, ..EstimateRequest::default() }).map(|_| ()),
        |i: Inputs| plan(&PlanRequest { inputs: i, ..PlanRequest::default() }).map(|_| ()),
    ] {
        let err = run(inputs("pythia-1b", "no-such-gpu")).expect_err("refused");
        assert_eq!(err.origin, "no-such-gpu");
        let fix = err.fix.expect("a fix");
        assert!(fix.contains("t4x2") && fix.contains("short form"), "{fix}");
    }
    let err = profile("no-such-gpu").expect_err("refused");
    assert!(err.fix.is_some());
}

#[test]
fn a_config_given_as_text_or_built_estimates_as_its_name() {
    let by_name =
        estimate(&EstimateRequest { inputs: inputs("pythia-1b", "t4"), ..EstimateRequest::default() })
            .expect("by name");
    let text = catalog::builtin_config("pythia-1b").expect("built-in").to_string();
    let config = ModelSource::ConfigJson { text, origin: "pythia-1b".into() };
    let by_config = estimate(&EstimateRequest {
        inputs: Inputs { model: config, ..inputs("", "t4") },
        ..EstimateRequest::default()
    })
    .expect("by config text");
    assert_eq!(by_config.to_json(), by_name.to_json());
    let built = vramplan_profiles::model::load("pythia-1b", ImportOptions::default()).expect("load");
    let by_description = estimate(&EstimateRequest {
        inputs: Inputs { model: ModelSource::Description(Box::new(built)), ..inputs("", "t4") },
        ..EstimateRequest::default()
    })
    .expect("by description");
    assert_eq!(by_description.to_json(), by_name.to_json());
}

#[test]
fn a_device_map_in_memory_reads_as_its_file() {
    let folder = tempfile::tempdir().expect("temp dir");
    let path = folder.path().join("map.json");
    std::fs::write(&path, r#"{"gpt_neox.embed_in": 0, "gpt_neox.rotary_emb": 0, "gpt_neox.layers": 1, "gpt_neox.final_layer_norm": 1, "lm_head": 1}"#)
        .expect("write");
    let entries = vec![
        ("gpt_neox.embed_in".to_string(), serde_json::json!(0)),
        ("gpt_neox.rotary_emb".to_string(), serde_json::json!(0)),
        ("gpt_neox.layers".to_string(), serde_json::json!(1)),
        ("gpt_neox.final_layer_norm".to_string(), serde_json::json!("cuda:1")),
        ("lm_head".to_string(), serde_json::json!(1)),
    ];
    let run = |map: DeviceMapSource| {
        let map = MapSource { device_map: Some(map), ..MapSource::default() };
        estimate(&EstimateRequest { inputs: inference("pythia-1b", "t4x2", 1, 512), map })
    };
    let from_file = run(DeviceMapSource::File(path)).expect("from the file");
    let in_memory = run(DeviceMapSource::Entries(entries)).expect("in memory");
    assert_eq!(in_memory.estimate, from_file.estimate);
    assert_eq!(in_memory.placement.entries().len(), 5);
    let bad = run(DeviceMapSource::Entries(vec![("gpt_neox.nothing".into(), serde_json::json!(0))]))
        .expect_err("not a module");
    assert_eq!(bad.origin, "device_map");
}

#[test]
fn check_finds_a_clean_map_clean() {
    let request = CheckRequest {
        device_map: DeviceMapSource::Entries(vec![(String::new(), serde_json::json!(0))]),
        inputs: inference("gpt2", "t4", 1, 512),
        target: "accelerate".into(),
    };
    let result = check(&request).expect("check");
    assert!(result.findings.is_empty(), "{:?}", result.findings);
    assert_eq!(result.fits(), Some(true));
    assert_eq!(result.outcome(), Outcome::Positive);
}

#[test]
fn inspect_and_profiles_answer_from_the_catalog() {
    let summary =
        inspect(&InspectRequest { model: "gpt2".into(), ..InspectRequest::default() }).expect("inspect");
    // GPT-2 small: 124,439,808 parameters (the published checkpoint, lm_head tied).
    assert_eq!(summary.params, 124_439_808);
    let all = profiles().expect("profiles");
    assert!(all.iter().any(|p| p.name == "t4x2"));
    assert_eq!(profile("2xt4").expect("short form").devices.len(), 2);
}

#[test]
fn whatif_max_batch_is_the_boundary_estimate_judges() {
    let request = WhatifRequest {
        query: Query::parse("max-batch").expect("a query"),
        inputs: inference("pythia-1b", "t4", 1, 2048),
        ..WhatifRequest::default()
    };
    let result = whatif(&request).expect("whatif");
    assert_eq!(result.outcome(), Outcome::Positive);
    let WhatifAnswer::MaxBatch(largest) = &result.answer else { panic!("{:?}", result.answer) };
    let value = largest.value.expect("a batch fits");
    let fits = |batch: u64| {
        estimate(&EstimateRequest {
            inputs: inference("pythia-1b", "t4", batch, 2048),
            ..EstimateRequest::default()
        })
        .expect("estimate")
        .estimate
        .fits
    };
    assert!(fits(value) && !fits(value + 1), "{value}");
    assert!(Query::parse("max-everything").is_err());
}

#[test]
fn whatif_grid_reports_its_progress() {
    let request = WhatifRequest {
        query: Query::Grid,
        inputs: inference("gpt2", "t4", 1, 512),
        axes: GridAxes { batch: Some("1..4".into()), ..GridAxes::default() },
        ..WhatifRequest::default()
    };
    let done = std::sync::Mutex::new((0, 0));
    let result = whatif_with_progress(&request, &|n, total| {
        let mut done = done.lock().unwrap();
        *done = (done.0 + n, total);
    })
    .expect("grid");
    let WhatifAnswer::Grid(grid) = &result.answer else { panic!() };
    assert_eq!(grid.points.len(), 3, "batch 1, 2, 4");
    assert_eq!(*done.lock().unwrap(), (3, 3));
}

#[test]
fn plot_returns_the_image_bytes() {
    let request = PlotRequest::new(PlotKind::Breakdown, inference("gpt2", "t4", 1, 512));
    let svg = String::from_utf8(plot(&request).expect("plot")).expect("SVG is text");
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{}", &svg[..60.min(svg.len())]);
    let png = plot(&PlotRequest { format: ImageFormat::Png, ..request.clone() }).expect("png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let wrong = PlotRequest { baseline: true, ..request };
    assert_eq!(plot(&wrong).expect_err("refused").origin, "--baseline");
}

#[test]
fn report_returns_its_files() {
    let request = ReportRequest {
        inputs: inference("gpt2", "t4", 1, 512),
        output: PathBuf::from("out/report.md"),
        ..ReportRequest::default()
    };
    let report = report(&request).expect("report");
    assert_eq!(report.kind, ReportKind::Markdown);
    assert_eq!(report.document.0, PathBuf::from("out/report.md"));
    for (path, svg) in &report.drawings {
        assert!(path.starts_with("out") && path.extension().is_some_and(|e| e == "svg"), "{path:?}");
        assert!(report.document.1.contains(path.file_name().unwrap().to_str().unwrap()));
        assert!(svg.contains("<svg"));
    }
    assert!(!report.drawings.is_empty());
    let html = ReportRequest { output: PathBuf::from("report.html"), ..request.clone() };
    assert!(vramplan_api::report(&html).expect("html").drawings.is_empty());
    let neither = ReportRequest { output: PathBuf::from("report.txt"), ..request };
    assert_eq!(vramplan_api::report(&neither).expect_err("refused").origin, "-o");
}

#[test]
fn validate_without_its_python_is_no_device() {
    let folder = tempfile::tempdir().expect("temp dir");
    let plan_path = folder.path().join("plan.yaml");
    let solved = plan(&PlanRequest {
        inputs: inference("gpt2", "t4", 1, 128),
        output: Some("plan.yaml".into()),
        ..PlanRequest::default()
    })
    .expect("plan");
    std::fs::write(&plan_path, solved.export.expect("export").1.text).expect("write");
    let request = ValidateRequest {
        backend: vramplan_validate::Backend::Torch,
        python: "/no/such/python".into(),
        ..ValidateRequest::new(PlanSource::File(plan_path))
    };
    let result = validate(&request).expect("validate");
    assert!(result.findings.is_empty());
    assert!(result.unavailable.is_some() && result.run.is_none());
    assert_eq!(result.outcome(), Outcome::NoDevice);
    assert_eq!(result.outcome().exit_code(), EXIT_NO_DEVICE);
    let json: serde_json::Value = serde_json::from_str(&result.to_json()).expect("JSON");
    assert_eq!(json["ok"], false);
}

#[test]
fn validate_script_refuses_what_is_not_a_file() {
    let request = ValidateScriptRequest::new(PathBuf::from("/no/such/train.py"), "t4");
    let err = validate_script(&request, &mut |_| {}).expect_err("refused");
    assert!(err.fix.is_some());
}

#[test]
fn outcomes_are_the_exit_codes() {
    assert_eq!(Outcome::Positive.exit_code(), 0);
    assert_eq!(Outcome::Negative.exit_code(), 1);
    assert_eq!(Outcome::NoDevice.exit_code(), 3);
    assert_eq!(Outcome::NoAnswer.exit_code(), 4);
}

/// The request types cross threads: a binding can run them with the GIL released.
#[test]
fn requests_and_results_are_send() {
    fn send<T: Send + Sync>() {}
    send::<PlanRequest>();
    send::<PlanResult>();
    send::<EstimateRequest>();
    send::<EstimateResult>();
    send::<CheckRequest>();
    send::<WhatifRequest>();
    send::<WhatifResult>();
    send::<ValidateRequest>();
    send::<PlotRequest>();
    send::<ReportRequest>();
    send::<InputError>();
}
