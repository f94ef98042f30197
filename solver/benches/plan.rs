//! Planning speed, in process, for the README's targets: Mixtral-8x7B 4-bit on `t4x2` (< 50 ms),
//! Llama-2-70B on `a100-40gb-x4` (< 100 ms), DeepSeek-V3 expert-parallel on 32 H100s
//! (`h100-80gb-x8-n4`, < 2 s with a proven gap ≤ 1 %). Each iteration builds the problem,
//! solves it and simulates the result.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::plan::{Settings, plan};

fn bench(c: &mut Criterion, name: &str, model_name: &str, hw: &str, workload: Workload, runtime: Runtime) {
    let model = model::load(model_name, ImportOptions { naming: runtime.naming() }).unwrap();
    let hardware = hardware::load(hw).unwrap();
    let request = Request::new(runtime);
    let settings = Settings::default();
    let first = plan(&model, &hardware, &workload, &request, &settings).unwrap();
    println!(
        "{name}: feasible {}, status {}, objective {:.4}, bound {:.4}, gap {:.3}%",
        first.feasible,
        first.solver.status,
        first.solver.objective,
        first.solver.bound,
        100.0 * first.solver.gap
    );
    c.bench_function(name, |b| {
        b.iter(|| plan(black_box(&model), &hardware, &workload, &request, &settings).unwrap())
    });
}

fn plans(c: &mut Criterion) {
    let inference = |batch, seq| Workload { mode: Mode::Inference, batch, seq, ..Workload::default() };
    let fp16 = Some(vramplan_profiles::DType::F16);
    bench(
        c,
        "plan mixtral-8x7b nf4 t4x2",
        "mixtral-8x7b",
        "t4x2",
        Workload { quant: Quant::Nf4 { double_quant: true }, weight_dtype: fp16, ..inference(1, 1024) },
        Runtime::Accelerate,
    );
    bench(
        c,
        "plan llama-2-70b fp16 a100-40gb-x4",
        "llama-2-70b",
        "a100-40gb-x4",
        Workload { weight_dtype: fp16, ..inference(1, 4096) },
        Runtime::Accelerate,
    );
    // A long pipeline: the chain's partition decides the balance without branching.
    bench(
        c,
        "plan llama-2-70b qlora training 32xt4",
        "llama-2-70b",
        "32xt4",
        Workload {
            mode: Mode::Train,
            batch: 1,
            seq: 1024,
            quant: Quant::Nf4 { double_quant: true },
            finetune: Finetune::Lora { rank: 16, alpha: 32, targets: Vec::new() },
            grad_checkpointing: GradCheckpointing::Full,
            ..Workload::default()
        },
        Runtime::Accelerate,
    );
    bench(
        c,
        "plan deepseek-v3 fp8 expert-parallel h100-80gb-x8-n4",
        "deepseek-v3",
        "h100-80gb-x8-n4",
        // The checkpoint's own fp8 weights with 128 × 128 block scales; one 4096-token
        // sequence (transformers caches MLA's decompressed keys and values: 20 GB of it).
        Workload { quant: Quant::Fp8 { block: 128 }, ..inference(1, 4096) },
        Runtime::ExpertParallel,
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = plans
}
criterion_main!(benches);
