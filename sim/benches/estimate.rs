//! Criterion bench: one full estimate with the step timeline, in-process (target: Llama-2-70B
//! training under 1 ms).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::workload::{GradCheckpointing, Mode, Workload};
use vramplan_sim::{Placement, estimate};

fn bench(c: &mut Criterion) {
    let model = model::load("llama-2-70b", ImportOptions::default()).expect("built-in");
    let hw = hardware::load("a100-80gb-x4").expect("profile");
    let workload = Workload {
        mode: Mode::Train,
        batch: 4,
        seq: 4096,
        weight_dtype: Some(DType::BF16),
        grad_checkpointing: GradCheckpointing::Full,
        ..Workload::default()
    };
    let placement = Placement::even_layers(&model, 4);
    c.bench_function("estimate llama-2-70b training on a100-80gb-x4", |b| {
        b.iter(|| estimate(black_box(&model), &hw, black_box(&workload), &placement))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
