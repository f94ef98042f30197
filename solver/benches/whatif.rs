//! What-if speed, in process, for the README's targets: one `max-batch` query on Llama-3-70B
//! (< 20 ms; QLoRA training on one A100-80GB, every probe a full step replay) and a grid of
//! 10,000 points (< 1 s on 2 cores; Qwen2.5-0.5B LoRA training on a T4, 100 batches × 100
//! sequence lengths).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{AxisValue, Question, grid, max_batch};

fn lora() -> Finetune {
    Finetune::Lora { rank: 16, alpha: 32, targets: Vec::new() }
}

fn bench(c: &mut Criterion) {
    let request = Request { headroom: 0.0, offload: false, ..Request::new(Runtime::Accelerate) };

    let model = model::load("llama-3-70b", ImportOptions::default()).unwrap();
    let hw = hardware::load("a100-80gb").unwrap();
    let workload = Workload {
        mode: Mode::Train,
        seq: 2048,
        quant: Quant::Nf4 { double_quant: true },
        finetune: lora(),
        grad_checkpointing: GradCheckpointing::Full,
        ..Workload::default()
    };
    let question = Question { model: &model, hardware: &hw, workload: &workload, request: &request };
    let first = max_batch(&question).unwrap();
    println!(
        "max-batch llama-3-70b qlora on a100-80gb: {:?} after {} simulations",
        first.value, first.probes
    );
    c.bench_function("whatif max-batch llama-3-70b qlora on a100-80gb", |b| {
        b.iter(|| max_batch(black_box(&question)).unwrap())
    });

    let small = model::load("qwen2.5-0.5b", ImportOptions::default()).unwrap();
    let t4 = hardware::load("t4").unwrap();
    let train = Workload { mode: Mode::Train, finetune: lora(), ..Workload::default() };
    let question = Question { model: &small, hardware: &t4, workload: &train, request: &request };
    let axes = vec![
        (1..=100).map(AxisValue::Batch).collect::<Vec<_>>(),
        (1..=100).map(|k| AxisValue::Seq(64 * k)).collect::<Vec<_>>(),
    ];
    let points = grid(&question, &axes, &|_| {}).unwrap();
    let fits = points.points.iter().filter(|p| p.fits).count();
    println!("grid qwen2.5-0.5b lora on t4: {} points, {fits} fit", points.points.len());
    let mut group = c.benchmark_group("whatif grid");
    group.sample_size(10);
    group.bench_function("10,000 points, qwen2.5-0.5b lora on t4", |b| {
        b.iter(|| grid(black_box(&question), &axes, &|_| {}).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
