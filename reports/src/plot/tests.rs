//! Every plot kind drawn for long names and many units, its text boxes taken from the renderer
//! ([`text_boxes`]: plotters' measure of each text in the embedded font, anchored and rotated as
//! drawn): no text may leave the canvas, and no two texts may overlap. The inputs are what
//! users feed the figures: a long model name, YAML hardware profiles with long file and GPU
//! names, Llama-3.1-405B and DeepSeek-V3 planned over eight GPUs (with accelerate's map
//! beside), a sweep whose boundary sits beside a probed value, grids over batch, sequence and
//! hardware. The figures are built from the lower crates' results as `vramplan plot` builds
//! them.

use super::*;
use std::path::PathBuf;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_sim::Placement;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Parallelism, Quant, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::plan::{Settings, SolverKind, plan};
use vramplan_solver::whatif::{self, AxisValue, Question};
use vramplan_validate::DevicePeaks;

/// A model name as long as a local checkpoint's folder can make it.
const LONG_MODEL: &str = "meta-llama/Llama-3.1-405B-Instruct-our-own-long-running-fine-tune-checkpoint-0042";

/// A YAML profile of eight H100s with a long file name and a long GPU name.
const EIGHT: (&str, &str) = (
    "our-lab-h100-node-07-shared-with-the-vision-and-speech-teams.yaml",
    "devices:\n  - gpu: h100-80gb\n    name: NVIDIA H100 80GB HBM3 (node 07, partition A, shared)\n    count: 8\n",
);

/// A YAML profile of two different GPUs with long names.
const TWO: (&str, &str) = (
    "our-lab-workstation-rtx4090-and-rtx3090-under-the-desk.yaml",
    "devices:\n  - gpu: rtx4090\n    name: NVIDIA GeForce RTX 4090 Founders Edition (slot 1, x16)\n  \
     - gpu: rtx3090\n    name: NVIDIA GeForce RTX 3090 Ti Gaming OC (slot 2, x8 riser)\n",
);

/// `(file, text)` written to a folder of this test run; its path, as a user types it.
fn profile_file((name, text): (&str, &str)) -> String {
    let folder: PathBuf = std::env::temp_dir().join(format!("vramplan-plot-layout-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn load(model_name: &str, spec: &str) -> (ModelDescription, HardwareProfile) {
    let model = model::load(model_name, ImportOptions { naming: Naming::V5 }).unwrap();
    (model, hardware::load(spec).unwrap())
}

fn train_lora(batch: u64, seq: u64) -> Workload {
    Workload {
        mode: Mode::Train,
        batch,
        seq,
        finetune: Finetune::Lora { rank: 16, alpha: 32, targets: Vec::new() },
        grad_checkpointing: GradCheckpointing::Full,
        ..Workload::default()
    }
}

fn nf4() -> Workload {
    Workload { quant: Quant::Nf4 { double_quant: false }, ..Workload::default() }
}

/// The heading `vramplan plot` writes, for the long model name.
fn caption(what: &str, spec: &str, workload: &Workload, shape: Option<&str>) -> String {
    format!("{what} · {LONG_MODEL} on {spec} · {}", workload_words(workload, shape))
}

/// The faults of `figure`'s layout, each named with the figure.
fn faults(name: &str, figure: &impl Figure) -> Vec<String> {
    let layout = text_boxes(figure).unwrap();
    assert!(layout.boxes.len() > 5, "{name}: texts are recorded ({})", layout.boxes.len());
    layout.faults().into_iter().map(|f| format!("{name}: {f}")).collect()
}

fn breakdowns() -> Vec<String> {
    let two = profile_file(TWO);
    let (model, hardware) = load("qwen2.5-7b", &two);
    let workload = Workload { quant: Quant::Nf4 { double_quant: false }, ..train_lora(4, 2048) };
    let placement = Placement::even_layers(&model, 2);
    let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement).unwrap();
    let measured: Vec<DevicePeaks> = estimate
        .devices
        .iter()
        .map(|d| DevicePeaks {
            device: d.id,
            name: d.name.clone(),
            allocated_bytes: d.peak_allocated_bytes,
            reserved_bytes: d.peak_reserved_bytes,
            driver_used_bytes: d.device_used_bytes,
            driver_used_before_bytes: 0,
            peak_event: d.peak_at.clone(),
        })
        .collect();
    let title = caption("memory at the peak", &two, &workload, None);
    let mut found = faults(
        "breakdown, measured",
        &Breakdown { title: title.clone(), devices: &estimate.devices, measured: Some(&measured) },
    );
    let eight = profile_file(EIGHT);
    let (model, hardware) = load("llama-3.1-405b", &eight);
    let estimate =
        vramplan_sim::estimate(&model, &hardware, &nf4(), &Placement::even_layers(&model, 8)).unwrap();
    let title = caption("memory at the peak", &eight, &nf4(), None);
    found.extend(faults(
        "breakdown, 8 GPUs",
        &Breakdown { title, devices: &estimate.devices, measured: None },
    ));
    found
}

fn timelines() -> Vec<String> {
    let two = profile_file(TWO);
    let (model, hardware) = load("qwen2.5-0.5b", &two);
    let workload = train_lora(4, 1024);
    let placement = Placement::even_layers(&model, 2);
    let trace = vramplan_sim::trace::trace(&model, &hardware, &workload, &placement, 2000).unwrap();
    let title = caption("the step over time", &two, &workload, None);
    let mut found = faults("timeline", &TimelineFigure { title, trace: &trace });
    let eight = profile_file(EIGHT);
    let (model, hardware) = load("llama-3.1-405b", &eight);
    let workload = Workload { seq: 4096, ..nf4() };
    let placement = Placement::even_layers(&model, 8);
    let trace = vramplan_sim::trace::trace(&model, &hardware, &workload, &placement, 2000).unwrap();
    let title = caption("the step over time", &eight, &workload, None);
    found.extend(faults("timeline, 8 GPUs", &TimelineFigure { title, trace: &trace }));
    found
}

fn plans() -> Vec<String> {
    let eight = profile_file(EIGHT);
    let mut found = Vec::new();
    for (name, model_name, workload, runtime, spec) in [
        ("plan, Llama-3.1-405B", "llama-3.1-405b", nf4(), Runtime::Accelerate, eight.clone()),
        ("plan, DeepSeek-V3", "deepseek-v3", Workload::default(), Runtime::Accelerate, eight.clone()),
        (
            "plan, experts",
            "qwen3-30b-a3b",
            Workload::default(),
            Runtime::ExpertParallel,
            "a100-80gb-x4".into(),
        ),
    ] {
        let (model, hardware) = load(model_name, &spec);
        let request = Request::new(runtime);
        let planned = plan(&model, &hardware, &workload, &request, &Settings::default()).unwrap();
        let greedy = Settings { solver: SolverKind::Greedy, ..Settings::default() };
        let baseline = (runtime == Runtime::Accelerate)
            .then(|| plan(&model, &hardware, &workload, &request, &greedy).unwrap());
        let title = caption("device map", &spec, &workload, None);
        found.extend(faults(name, &PlacementFigure { title, plan: &planned, baseline: baseline.as_ref() }));
    }
    found
}

fn sweeps() -> Vec<String> {
    let mut found = Vec::new();
    // Two GPUs: a map solved at every batch, none past the boundary.
    let two = profile_file(TWO);
    let (model, hardware) = load("qwen2.5-0.5b", &two);
    let mut request = Request::new(Runtime::Accelerate);
    (request.headroom, request.offload) = (0.0, false);
    let workload = Workload { mode: Mode::Train, seq: 2048, ..Workload::default() };
    let question = Question { model: &model, hardware: &hardware, workload: &workload, request: &request };
    let probe = |values: &[u64]| probe_batches(&question, values);
    let answer = whatif::max_batch(&question).unwrap();
    let points = probe(&[1, 2, 4, 8, 16, 32, 64, 128, 256]);
    let title = caption("peak against the sweep", &two, &workload, Some("batch swept × 2048"));
    found.extend(faults("sweep, 2 GPUs", &SweepFigure { title, points: &points, answer: &answer }));
    // One GPU: the boundary beside a probed value, on a doubling axis and on a linear one.
    let (model, hardware) = load("qwen2.5-0.5b", "rtx4090");
    let workload = Workload { mode: Mode::Train, seq: 256, ..Workload::default() };
    let question = Question { model: &model, hardware: &hardware, workload: &workload, request: &request };
    let answer = whatif::max_batch(&question).unwrap();
    let value = answer.value.unwrap();
    assert!(value > 20, "a boundary well inside the sweep: {value}");
    let probe = |values: &[u64]| probe_batches(&question, values);
    let mut doubling: Vec<u64> = (0..12).map(|k| 1u64 << k).filter(|&b| b < value * 4).collect();
    doubling.push(value - 1);
    doubling.sort_unstable();
    let title = caption("peak against the sweep", "rtx4090", &workload, Some("batch swept × 256"));
    let points = probe(&doubling);
    found.extend(faults(
        "sweep, doubling",
        &SweepFigure { title: title.clone(), points: &points, answer: &answer },
    ));
    let step = (value / 5).max(1);
    let linear: Vec<u64> = (1..=7).map(|k| k * step).chain([value - 1]).collect();
    let points = probe(&linear);
    found.extend(faults("sweep, linear", &SweepFigure { title, points: &points, answer: &answer }));
    // The sequence length, doubling.
    let answer = whatif::max_seq(&question, false).unwrap();
    let points: Vec<(u64, whatif::Fit)> = (9..16)
        .map(|k| 1u64 << k)
        .map(|seq| (seq, whatif::probe(&question, &hardware, &Workload { seq, ..workload.clone() }).unwrap()))
        .collect();
    let title = caption("peak against the sweep", "rtx4090", &workload, Some("batch 1 × sequence swept"));
    found.extend(faults("sweep, sequence", &SweepFigure { title, points: &points, answer: &answer }));
    found
}

fn grids() -> Vec<String> {
    let (two, eight) = (profile_file(TWO), profile_file(EIGHT));
    let (model, hardware) = load("qwen2.5-0.5b", &two);
    let mut request = Request::new(Runtime::Accelerate);
    (request.headroom, request.offload) = (0.0, false);
    let workload = train_lora(1, 2048);
    let question = Question { model: &model, hardware: &hardware, workload: &workload, request: &request };
    let mut found = Vec::new();
    let batch: Vec<AxisValue> = (0..7).map(|k| AxisValue::Batch(1 << k)).collect();
    let seq: Vec<AxisValue> = (0..6).map(|k| AxisValue::Seq(512 << k)).collect();
    let hardware_axis: Vec<AxisValue> =
        [two.clone(), eight, "t4".to_string()].into_iter().map(AxisValue::Hardware).collect();
    for (name, axes) in [
        ("grid, batch × seq", vec![batch.clone(), seq]),
        ("grid, hardware × batch", vec![hardware_axis, batch]),
    ] {
        let grid = whatif::grid(&question, &axes, &|_| ()).unwrap();
        let title =
            caption("utilisation over the grid", &two, &workload, Some("batch swept × sequence swept"));
        found.extend(faults(name, &GridFigure { title, axes: &axes, grid: &grid }));
    }
    found
}

#[test]
fn no_text_leaves_the_canvas_or_overlaps_another_in_any_figure() {
    let mut found = breakdowns();
    found.extend(timelines());
    found.extend(plans());
    found.extend(sweeps());
    found.extend(grids());
    assert!(found.is_empty(), "{} layout faults:\n{}", found.len(), found.join("\n"));
}

#[test]
fn titles_say_what_is_trained_and_how_the_gpus_share_it() {
    let full = Workload { mode: Mode::Train, batch: 4, seq: 2048, ..Workload::default() };
    assert_eq!(workload_words(&full, None), "train, all parameters, batch 4 × 2048");
    let ddp = Workload { parallelism: Parallelism::Ddp, ..full.clone() };
    assert_eq!(workload_words(&ddp, None), "train, all parameters, DDP, batch 4 × 2048 per GPU");
    let fsdp = Workload {
        parallelism: Parallelism::Zero { stage: 3, offload_optimizer: true, offload_params: false },
        ..train_lora(2, 1024)
    };
    assert_eq!(
        workload_words(&fsdp, Some("batch swept × 1024")),
        "train, LoRA r16, ZeRO-3 / FSDP, optimizer states on the CPU, batch swept × 1024 per GPU, checkpointing"
    );
    let zero1 = Workload {
        parallelism: Parallelism::Zero { stage: 1, offload_optimizer: false, offload_params: false },
        ..full
    };
    assert!(workload_words(&zero1, None).contains("ZeRO-1"));
    assert_eq!(workload_words(&nf4(), None), "inference, nf4, batch 1 × 2048");
    let tp = Workload { parallelism: Parallelism::tensor(2), ..Workload::default() };
    assert_eq!(workload_words(&tp, None), "inference, tensor parallel over 2 GPUs, batch 1 × 2048");
}

/// `question` probed at each batch of `values`.
fn probe_batches(question: &Question, values: &[u64]) -> Vec<(u64, whatif::Fit)> {
    values
        .iter()
        .map(|&batch| {
            let workload = Workload { batch, ..question.workload.clone() };
            (batch, whatif::probe(question, question.hardware, &workload).unwrap())
        })
        .collect()
}
