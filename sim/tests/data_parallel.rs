//! Data parallelism against closed forms taken from the runtimes' code: DDP's gradient buckets
//! hold exactly the trainable parameters' bytes (PyTorch's `Reducer`: one flat `at::empty`
//! per dtype and device at construction, with `gradient_as_bucket_view=False` a second copy of
//! the gradients), charged as the caching allocator charges one large block; and every GPU of
//! the profile is a rank, reported on its own and judged against its own memory.

use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::estimate::{data_parallel_estimate, estimate_within, keeps_replica_whole};
use vramplan_sim::program::{Alloc, Component, Event, Op, StepProgram, step_program};
use vramplan_sim::workload::{Finetune, Mode, Parallelism, Workload};
use vramplan_sim::{Placement, Target, estimate};

fn builtin(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in model")
}

fn profile(name: &str) -> HardwareProfile {
    hardware::load(name).expect("built-in profile")
}

fn train(parallelism: Parallelism) -> Workload {
    Workload { mode: Mode::Train, batch: 2, seq: 512, parallelism, ..Workload::default() }
}

/// The allocations of `program` for no unit holding gradients: DDP's buckets.
fn buckets(program: &StepProgram) -> Vec<Alloc> {
    program
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc(a) if a.unit.is_none() && a.component == Component::Gradients => Some(*a),
            _ => None,
        })
        .collect()
}

/// What PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) charges one request of
/// `bytes` over 10 MiB served from a new segment: the request rounds up to 512 B
/// (`kMinBlockSize`), the segment to 2 MiB (`kRoundLarge`), and the segment's rest is split off
/// only when more than 1 MiB (`kSmallSize`) remains; otherwise the whole segment is charged.
fn charged_new_large_segment(bytes: u64) -> u64 {
    assert!(bytes > 10 << 20, "a closed form for requests over kMinLargeAlloc only");
    let size = bytes.div_ceil(512) * 512;
    let segment = size.div_ceil(2 << 20) * (2 << 20);
    if segment - size > 1 << 20 { size } else { segment }
}

/// A full fine-tune trains every parameter: DDP's one bucket (the model's one dtype, one GPU)
/// holds P × element size bytes, P the model's parameters with each tied group once (DDP's
/// `_build_params_for_reducer` deduplicates shared parameters), allocated at load after the
/// weights and before the first compute; single-GPU training has no bucket.
#[test]
fn ddp_bucket_holds_every_trainable_parameter_once() {
    let hw = profile("a10g");
    for name in ["llama-3.2-1b", "pythia-410m", "gpt2"] {
        let model = builtin(name);
        // Every parameter trains in the checkpoint's dtype.
        let expected = model.summary().dtype.bytes_for(model.params());
        let ddp = step_program(&model, &hw, &train(Parallelism::Ddp), &Placement::single(0));
        let found = buckets(&ddp);
        assert_eq!(found.len(), 1, "{name}: one bucket per dtype and device");
        assert_eq!(found[0].bytes, expected, "{name}: the bucket is the trainable parameters' bytes");
        assert_eq!(found[0].device, 0);
        // At load: after every weight, before the first unit computes.
        let at = ddp.ops.iter().position(|op| matches!(op, Op::Alloc(a) if a.id == found[0].id)).unwrap();
        let first_compute =
            ddp.ops.iter().position(|op| matches!(op, Op::Compute(c) if c.event != Event::Load)).unwrap();
        assert!(at < first_compute, "{name}: the bucket comes with the wrap, before the step");
        assert!(
            ddp.ops[..at].iter().all(|op| !matches!(op, Op::Alloc(a) if a.component == Component::Workspace)),
            "{name}: after the weights, before the first matmul's workspaces"
        );
        let single = step_program(&model, &hw, &train(Parallelism::Single), &Placement::single(0));
        assert!(buckets(&single).is_empty(), "{name}: no DDP, no bucket");
        // Inference has no Reducer.
        let serve = Workload { mode: Mode::Inference, ..train(Parallelism::Ddp) };
        assert!(buckets(&step_program(&model, &hw, &serve, &Placement::single(0))).is_empty());
    }
}

/// LoRA under DDP: only the adapters require grad, so the bucket is their bytes, in fp32 (PEFT
/// creates adapters in fp32 over a half base, `autocast_adapter_dtype=True`). Adapters on
/// `q_proj` (h → heads·d) and `v_proj` (h → kv_heads·d) of rank r: r·(in + out) each.
#[test]
fn ddp_bucket_under_lora_holds_the_adapters() {
    let model = builtin("llama-3.2-1b");
    let f = &model.facts;
    let (h, d) = (f.hidden_size, f.head_dim);
    let rank = 8;
    let per_layer = rank * (h + f.num_attention_heads * d) + rank * (h + f.num_kv_heads * d);
    let expected = 4 * per_layer * f.layers.len() as u64;
    let mut workload = train(Parallelism::Ddp);
    workload.finetune = Finetune::Lora { rank, alpha: 16, targets: vec!["q_proj".into(), "v_proj".into()] };
    let program = step_program(&model, &profile("a10g"), &workload, &Placement::single(0));
    let found = buckets(&program);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].bytes, expected);
}

/// The bucket stays for the whole run (through `zero_grad`) and is one large block: on one GPU,
/// DDP's bytes held between steps exceed single-GPU training's by what the caching allocator
/// charges that block, give or take one unsplit remainder (≤ 1 MiB): the block's own split-off
/// rest can change which later allocation is charged a whole block.
#[test]
fn ddp_bucket_is_held_between_steps_as_one_allocator_block() {
    let hw = profile("a10g");
    for name in ["llama-3.2-1b", "pythia-410m"] {
        let model = builtin(name);
        let single = estimate(&model, &hw, &train(Parallelism::Single), &Placement::single(0)).unwrap();
        let ddp = estimate(&model, &hw, &train(Parallelism::Ddp), &Placement::single(0)).unwrap();
        let program = step_program(&model, &hw, &train(Parallelism::Ddp), &Placement::single(0));
        let bucket = buckets(&program)[0].bytes;
        let held = ddp.devices[0].steady_bytes as i64 - single.devices[0].steady_bytes as i64;
        let charged = charged_new_large_segment(bucket) as i64;
        assert!((held - charged).abs() <= 1 << 20, "{name}: {held} held, {charged} charged");
        assert!(ddp.devices[0].peak_allocated_bytes >= single.devices[0].peak_allocated_bytes + bucket);
    }
}

/// Every GPU of a mixed profile is a rank: one device per GPU, in profile order, each with its
/// own capacity and usable memory, judged against them. The ranks hold the same tensors, so
/// their allocated peaks agree; the smaller GPU runs out first.
#[test]
fn one_rank_per_gpu_each_against_its_own_memory() {
    let model = builtin("llama-3.2-1b");
    let hw = profile("a10g+t4");
    let workload = Workload { batch: 1, seq: 2048, ..train(Parallelism::Ddp) };
    let e = estimate(&model, &hw, &workload, &Placement::single(0)).unwrap();
    assert_eq!(e.devices.len(), 2);
    for (rank, d) in e.devices.iter().enumerate() {
        let gpu = &hw.devices[rank];
        assert_eq!(d.id, rank as u32);
        assert_eq!(d.name, gpu.name);
        assert_eq!(d.capacity_bytes, gpu.memory_bytes);
        assert_eq!(d.usable_bytes, gpu.usable_bytes());
        assert_eq!(d.fits, d.peak_reserved_bytes <= gpu.usable_bytes());
    }
    assert_eq!(e.devices[0].peak_allocated_bytes, e.devices[1].peak_allocated_bytes);
    // 1.24 B bf16 parameters: weights, gradients, their bucket copy and two AdamW states are
    // 5 × 2.47 GB = 12.4 GB (11.5 GiB) before anything of the step; with a 2048-token step's
    // logits (128,256 × 2048 × (2 + 4) B = 1.6 GB) and activations on top, the T4 (14.2 GiB
    // usable) runs out and the A10G (21.8 GiB) does not.
    assert!(e.devices[0].fits, "{:?}", e.devices[0]);
    assert!(!e.devices[1].fits, "{:?}", e.devices[1]);
    assert!(!e.fits);
    assert_eq!(e.peak_bytes, e.devices.iter().map(|d| d.device_used_bytes).max().unwrap());
}

/// ZeRO-3 over four equal GPUs: four ranks with the same figures, and each holds a quarter of
/// the weights between steps (rounded up per tensor, as shards are).
#[test]
fn zero3_reports_every_rank_the_same() {
    let model = builtin("llama-3.2-1b");
    let hw = profile("4xa10g");
    let zero3 = Parallelism::Zero { stage: 3, offload_optimizer: false, offload_params: false };
    let e = estimate(&model, &hw, &train(zero3), &Placement::single(0)).unwrap();
    assert_eq!(e.devices.iter().map(|d| d.id).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    for d in &e.devices[1..] {
        assert_eq!(d.peak_reserved_bytes, e.devices[0].peak_reserved_bytes);
        assert_eq!(d.steady_bytes, e.devices[0].steady_bytes);
        assert_eq!(d.peak_at, e.devices[0].peak_at);
    }
    let program = step_program(&model, &hw, &train(zero3), &Placement::single(0));
    let shards: Vec<u64> = program
        .ops
        .iter()
        .take_while(|op| !matches!(op, Op::Compute(c) if c.event != Event::Load))
        .filter_map(|op| match op {
            Op::Alloc(a) if a.component == Component::Weights => Some(a.bytes),
            _ => None,
        })
        .collect();
    let held: u64 = shards.iter().sum();
    // Σ ceil(b / 4) over the tensors lies within [whole / 4, whole / 4 + tensors].
    let whole = model.summary().bytes;
    assert!(held >= whole / 4 && held <= whole / 4 + shards.len() as u64, "{held} vs {whole} / 4");
}

/// A placement that splits the replica is refused as bad input, not replayed; a whole one on
/// any GPU, or none, gives the same ranks.
#[test]
fn a_split_replica_is_refused() {
    let model = builtin("gpt2");
    let hw = profile("t4x2");
    let split = Placement::from_entries(vec![
        ("transformer.h".into(), Target::Gpu(1)),
        (String::new(), Target::Gpu(0)),
    ]);
    assert!(!keeps_replica_whole(&split));
    let offload = Placement::from_entries(vec![(String::new(), Target::Cpu)]);
    assert!(!keeps_replica_whole(&offload));
    let err = estimate(&model, &hw, &train(Parallelism::Ddp), &split).unwrap_err();
    assert!(err.problem.contains("own GPU"), "{err}");
    assert!(err.fix.as_deref().is_some_and(|f| f.contains("{\"\": 0}")), "{err}");
    let on_one = estimate_within(&model, &hw, &train(Parallelism::Ddp), &Placement::single(1), 0.1).unwrap();
    let none = data_parallel_estimate(
        &model,
        &hw,
        &train(Parallelism::Ddp),
        &Placement::from_entries(Vec::new()),
        0.1,
    )
    .unwrap();
    assert_eq!(on_one, none);
    assert_eq!(none.devices.len(), 2);
}
