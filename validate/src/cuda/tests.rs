//! The `cuda` backend without a GPU: a fake driver that hands out address ranges and counts
//! what it holds, and a fake engine that records every call and checks that each range it
//! touches lies in a segment the fake driver holds on that device. The plan's FLOPs are held to
//! closed forms counted from the configs, the calls' operands to the program's live
//! allocations (replayed here, apart from the code under test), and a planted mismatch to
//! PyTorch's message.

use super::compute::{Runner, Stats};
use super::engine::{Call, Engine, Touch};
use super::ops::{GemmKind, GemmRole, Work};
use super::plan::Planner;
use super::*;
use std::cell::RefCell;
use std::rc::Rc;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::Placement;
use vramplan_sim::placement::Target;
use vramplan_sim::program::{Event, step_program};
use vramplan_sim::workload::{Finetune, Mode};

/// Where no driver is installed (CI), the probe names the libraries it tried, without
/// panicking; where one is, it names the one that loads.
#[test]
fn the_driver_probe_answers_either_way() {
    match driver_library() {
        Ok(name) => assert!(name.contains("cuda"), "{name}"),
        Err(Unavailable::NoDriver { tried }) => {
            assert!(tried.iter().any(|n| n == "libcuda.so" || n == "nvcuda.dll"), "{tried:?}")
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

type Held = Rc<RefCell<BTreeMap<u64, u64>>>;

/// A driver of `total` bytes that hands out address ranges apart from each other (from
/// `next`) and counts what it holds.
struct Fake {
    total: u64,
    held: Held,
    next: u64,
}

impl Driver for Fake {
    fn malloc(&mut self, bytes: u64) -> Result<Option<u64>, DriverError> {
        let used: u64 = self.held.borrow().values().sum();
        if used + bytes > self.total {
            return Ok(None);
        }
        let pointer = self.next;
        self.next += bytes.div_ceil(1 << 21) * (1 << 21) + (1 << 21);
        self.held.borrow_mut().insert(pointer, bytes);
        Ok(Some(pointer))
    }

    fn free(&mut self, pointer: u64) -> Result<(), DriverError> {
        self.held
            .borrow_mut()
            .remove(&pointer)
            .map(|_| ())
            .ok_or(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))
    }

    fn memory(&mut self) -> Result<(u64, u64), DriverError> {
        let used: u64 = self.held.borrow().values().sum();
        Ok((self.total - used, self.total))
    }
}

fn fake(index: u32, total: u64) -> (Device, Held) {
    let held: Held = Rc::new(RefCell::new(BTreeMap::new()));
    let driver = Fake { total, held: held.clone(), next: u64::from(index + 1) << 44 };
    (Device::new(index, "fake".into(), total, Box::new(driver)).unwrap(), held)
}

/// One recorded call.
#[derive(Debug, Clone)]
struct Recorded {
    device: u32,
    at: usize,
    call: Call,
    touched: Vec<Touch>,
}

/// An engine that records calls, refusing any that touches memory outside the segments its
/// device's fake driver holds.
struct Recorder {
    held: BTreeMap<u32, Held>,
    calls: Rc<RefCell<Vec<Recorded>>>,
    workspaces: Rc<RefCell<Vec<(u32, u64, u64)>>>,
}

impl Recorder {
    fn inside(&self, device: u32, pointer: u64, bytes: u64) -> bool {
        let held = self.held[&device].borrow();
        held.range(..=pointer).next_back().is_some_and(|(start, size)| pointer + bytes <= start + size)
    }
}

impl Engine for Recorder {
    fn set_workspace(&mut self, device: u32, pointer: u64, bytes: u64) -> Result<(), String> {
        if !self.inside(device, pointer, bytes) {
            return Err(format!("workspace outside cuda:{device}'s segments"));
        }
        self.workspaces.borrow_mut().push((device, pointer, bytes));
        Ok(())
    }

    fn run(&mut self, device: u32, at: usize, call: &Call, touched: &[Touch]) -> Result<(), String> {
        for t in touched {
            if !self.inside(t.device, t.pointer, t.bytes) {
                return Err(format!("{call:?} touches {t:?} outside cuda:{}'s segments", t.device));
            }
        }
        self.calls.borrow_mut().push(Recorded { device, at, call: call.clone(), touched: touched.to_vec() });
        Ok(())
    }

    fn synchronize(&mut self, _device: u32) -> Result<(), String> {
        Ok(())
    }
}

/// What a run with the fake engine gives back.
struct Ran {
    run: Validation,
    calls: Vec<Recorded>,
    workspaces: Vec<(u32, u64, u64)>,
    stats: Stats,
    held: Vec<Held>,
}

/// Runs `program` on fake GPUs `devices` of `total` bytes each, with its compute.
fn run_with_compute(
    program: &StepProgram,
    model: &ModelDescription,
    workload: &Workload,
    devices: &[u32],
    total: u64,
) -> Ran {
    let (mut map, mut helds) = (BTreeMap::new(), BTreeMap::new());
    for &d in devices {
        let (device, held) = fake(d, total);
        map.insert(d, device);
        helds.insert(d, held);
    }
    let calls = Rc::new(RefCell::new(Vec::new()));
    let workspaces = Rc::new(RefCell::new(Vec::new()));
    let recorder = Recorder { held: helds.clone(), calls: calls.clone(), workspaces: workspaces.clone() };
    let mut runner = Runner::new(model, workload, program, Box::new(recorder));
    let run = execute(program, map, Some(&mut runner)).unwrap();
    let stats = runner.stats.clone();
    drop(runner);
    Ran {
        run,
        calls: calls.take(),
        workspaces: workspaces.take(),
        stats,
        held: helds.into_values().collect(),
    }
}

/// Allocations by id: device and requested bytes.
type LiveSet = HashMap<AllocId, (u32, u64)>;

/// The allocations live before operation `at` of `program`, replayed from the program alone.
fn live_before(program: &StepProgram, at: usize) -> LiveSet {
    let mut live = HashMap::new();
    for op in &program.ops[..at] {
        match *op {
            Op::Alloc(Alloc { id, device, bytes, .. }) => {
                live.insert(id, (device, bytes));
            }
            Op::Free(id) => {
                live.remove(&id);
            }
            Op::Compute(_) => {}
        }
    }
    live
}

/// Every operand of every call lies inside an allocation live at that moment, on the call's
/// device (a copy's source excepted), within the bytes the program asked for.
/// The kernels `calls` launched.
fn launched(calls: &[Recorded]) -> BTreeSet<&'static str> {
    calls
        .iter()
        .filter_map(|c| match &c.call {
            Call::Launch { kernel, .. } => Some(*kernel),
            _ => None,
        })
        .collect()
}

fn assert_inside_live_allocations(program: &StepProgram, calls: &[Recorded]) {
    let mut cache: Option<(usize, LiveSet)> = None;
    for c in calls {
        if cache.as_ref().is_none_or(|(at, _)| *at != c.at) {
            cache = Some((c.at, live_before(program, c.at)));
        }
        let live = &cache.as_ref().unwrap().1;
        for (i, t) in c.touched.iter().enumerate() {
            let Some(&(device, bytes)) = live.get(&t.alloc) else {
                panic!("{:?} reads allocation {} not live at {}", c.call, t.alloc, c.at)
            };
            let copy_source = matches!(c.call, Call::Copy { .. }) && i == 0;
            assert!(copy_source || device == c.device, "{:?}: operand on cuda:{device}", c.call);
            assert_eq!(device, t.device);
            assert!(t.offset + t.bytes <= bytes, "{:?}: {t:?} passes the allocation's {bytes} bytes", c.call);
        }
    }
}

fn gpt2() -> ModelDescription {
    model::load("gpt2", ImportOptions::default()).unwrap()
}

/// A two-layer Llama with grouped-query attention and untied embeddings.
fn tiny_llama() -> ModelDescription {
    let config = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
        "torch_dtype": "bfloat16", "tie_word_embeddings": false}"#;
    model::hf::from_config_text(config, "tiny-llama", ImportOptions::default()).unwrap()
}

fn training(batch: u64, seq: u64) -> Workload {
    Workload { mode: Mode::Train, batch, seq, ..Workload::default() }
}

/// GPT-2 trained two steps on a T4 at batch 2 × 256: the program and the simulator's
/// estimate of it.
fn gpt2_training() -> (StepProgram, vramplan_sim::Estimate) {
    let model = gpt2();
    let hardware = vramplan_profiles::hardware::load("t4").unwrap();
    let workload = training(2, 256);
    let placement = Placement::single(0);
    let program = step_program(&model, &hardware, &workload, &placement);
    let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement).unwrap();
    (program, estimate)
}

/// On a device with room, the driver holds at the peak exactly the segments the allocator
/// model reserves (the simulator's reserved figure for the same program), and nothing once
/// the run is over.
#[test]
fn the_driver_holds_the_models_segments_and_gets_them_back() {
    let (program, predicted) = gpt2_training();
    let (device, held) = fake(0, 64 << 30);
    let run = execute(&program, BTreeMap::from([(0, device)]), None).unwrap();
    assert_eq!(run.outcome, Outcome::Completed);
    let d = &run.devices[0];
    assert_eq!(d.reserved_bytes, predicted.devices[0].peak_reserved_bytes);
    assert_eq!(d.allocated_bytes, predicted.devices[0].peak_allocated_bytes);
    assert_eq!(d.driver_used_bytes, d.reserved_bytes, "the fake driver holds only the segments");
    assert!(held.borrow().is_empty(), "segments left: {:?}", held.borrow());
    assert!(run.samples.iter().any(|s| s.event.starts_with("optimizer step")));
}

/// On a device too small, the refused segment ends the run with its event and device, and
/// every segment taken before it is given back.
#[test]
fn an_out_of_memory_is_reported_and_everything_given_back() {
    let (program, _) = gpt2_training();
    let (device, held) = fake(0, 300 << 20);
    let run = execute(&program, BTreeMap::from([(0, device)]), None).unwrap();
    match &run.outcome {
        Outcome::OutOfMemory { device, requested_bytes, free_bytes, event } => {
            assert_eq!(*device, 0);
            assert!(requested_bytes > free_bytes, "{requested_bytes} asked with {free_bytes} free");
            assert!(!event.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(held.borrow().is_empty(), "segments left: {:?}", held.borrow());
}

/// With the compute, GPT-2's two training steps complete; every call's operands lie in
/// allocations live on its device, in segments the driver holds; cuBLAS's workspace is the
/// program's; the measured figures are still exactly the simulator's; and the GEMMs of every
/// block ran in forward and backward.
#[test]
fn the_compute_stays_inside_the_programs_allocations() {
    let (program, predicted) = gpt2_training();
    let model = gpt2();
    let workload = training(2, 256);
    let ran = run_with_compute(&program, &model, &workload, &[0], 64 << 30);
    assert_eq!(ran.run.outcome, Outcome::Completed, "skipped: {:?}", ran.stats.skipped);
    let d = &ran.run.devices[0];
    assert_eq!(d.reserved_bytes, predicted.devices[0].peak_reserved_bytes);
    assert_eq!(d.allocated_bytes, predicted.devices[0].peak_allocated_bytes);
    assert!(ran.held.iter().all(|h| h.borrow().is_empty()), "segments left");
    assert_inside_live_allocations(&program, &ran.calls);
    let workspace = program.ops.iter().find_map(|op| match op {
        Op::Alloc(a) if a.component == vramplan_sim::program::Component::Workspace => Some(a.bytes),
        _ => None,
    });
    assert_eq!(ran.workspaces.iter().map(|w| w.2).collect::<Vec<_>>(), vec![workspace.unwrap()]);
    // Forward and backward GEMMs of each block's four linear layers ran, both steps.
    let gemms = ran.calls.iter().filter(|c| matches!(c.call, Call::Gemm(_))).count();
    assert!(gemms >= 2 * 12 * 4 * 3, "{gemms} GEMM calls");
    for skipped in &ran.stats.skipped {
        assert!(!skipped.contains("transformer.h."), "a block's operation did not run: {skipped}");
    }
    let kernels = launched(&ran.calls);
    for k in [
        "vp_layer_norm",
        "vp_act",
        "vp_attention",
        "vp_attention_backward_kv",
        "vp_cross_entropy",
        "vp_adamw",
    ] {
        assert!(kernels.contains(k), "{k} never ran: {kernels:?}");
    }
}

/// GEMM FLOPs of the plan over one training step, by kind and role.
fn plan_flops(
    model: &ModelDescription,
    workload: &Workload,
    program: &StepProgram,
) -> BTreeMap<(String, String), u64> {
    let planner = Planner::new(model, workload, program);
    let mut flops = BTreeMap::new();
    for op in &program.ops {
        let Op::Compute(c) = op else { continue };
        if !matches!(c.event, Event::Forward(_, 1) | Event::Backward(_, 1)) {
            continue;
        }
        for o in planner.plan(c.unit, c.device, c.event, None) {
            if let Work::Gemm(g) = o.work {
                *flops.entry((format!("{:?}", g.kind), format!("{:?}", g.role))).or_default() +=
                    o.gemm_flops();
            }
        }
    }
    flops
}

fn linear(flops: &BTreeMap<(String, String), u64>, kind: GemmKind, role: GemmRole) -> u64 {
    flops.get(&(format!("{kind:?}"), format!("{role:?}"))).copied().unwrap_or(0)
}

/// The forward's linear GEMMs do 2 × tokens × (weights of the linear layers), counted from the
/// configs: GPT-2 (L = 12, h = 768, a 4h MLP, the head tied to the 50257-token embedding) and a
/// two-layer Llama with GQA; a full fine-tune's backward does twice that (dX and dW).
#[test]
fn the_plans_linear_flops_match_the_closed_forms() {
    let hardware = vramplan_profiles::hardware::load("h100-80gb").unwrap();
    let (h, layers, vocab) = (768u64, 12u64, 50257u64);
    let gpt2_weights = layers * (h * 3 * h + h * h + h * 4 * h + 4 * h * h) + vocab * h;
    let (lh, li, kv, lvocab) = (256u64, 688u64, 2 * 32u64, 1000u64);
    let llama_weights = 2 * (lh * lh + 2 * lh * kv + lh * lh + 3 * lh * li) + lvocab * lh;
    for (model, weights) in [(gpt2(), gpt2_weights), (tiny_llama(), llama_weights)] {
        let workload = training(2, 128);
        let program = step_program(&model, &hardware, &workload, &Placement::single(0));
        let flops = plan_flops(&model, &workload, &program);
        let tokens = 2 * 128;
        assert_eq!(
            linear(&flops, GemmKind::Linear, GemmRole::Forward),
            2 * tokens * weights,
            "{}",
            model.name
        );
        let backward = linear(&flops, GemmKind::Linear, GemmRole::InputGrad)
            + linear(&flops, GemmKind::Linear, GemmRole::WeightGrad);
        assert_eq!(backward, 2 * 2 * tokens * weights, "{}", model.name);
    }
}

/// Under LoRA the frozen base layers get only their input's gradient; the weight gradients
/// are the adapters': 2 × tokens × r × (in + out) per target (PEFT's default for Llama, q and v).
#[test]
fn under_lora_only_the_adapters_get_weight_gradients() {
    let model = tiny_llama();
    let hardware = vramplan_profiles::hardware::load("h100-80gb").unwrap();
    let workload =
        Workload { finetune: Finetune::Lora { rank: 8, alpha: 16, targets: Vec::new() }, ..training(2, 128) };
    let program = step_program(&model, &hardware, &workload, &Placement::single(0));
    let flops = plan_flops(&model, &workload, &program);
    let tokens = 2 * 128;
    let forward = linear(&flops, GemmKind::Linear, GemmRole::Forward);
    assert_eq!(linear(&flops, GemmKind::Linear, GemmRole::InputGrad), forward);
    assert_eq!(linear(&flops, GemmKind::Linear, GemmRole::WeightGrad), 0);
    let adapters = 2 * 8 * ((256 + 256) + (256 + 64));
    assert_eq!(linear(&flops, GemmKind::Adapter, GemmRole::WeightGrad), 2 * tokens * adapters);
    assert_eq!(linear(&flops, GemmKind::Adapter, GemmRole::Forward), 2 * tokens * adapters);
}

/// The load allocates one weight per tensor, in the order the planner lists a unit's tensors,
/// so each tensor is read from its own allocation: GPT-2, the tiny Llama with LoRA, Mixtral's
/// fused experts and T5's shared embedding.
#[test]
fn each_units_load_allocations_are_its_tensors_in_order() {
    let hardware = vramplan_profiles::hardware::load("h100-80gb").unwrap();
    let lora =
        Workload { finetune: Finetune::Lora { rank: 4, alpha: 8, targets: Vec::new() }, ..training(1, 64) };
    let cases = [
        (gpt2(), training(1, 64)),
        (tiny_llama(), lora),
        (model::load("mixtral-8x7b", ImportOptions::default()).unwrap(), Workload::default()),
        (model::load("t5-base", ImportOptions::default()).unwrap(), Workload::default()),
    ];
    for (model, workload) in cases {
        let program = step_program(&model, &hardware, &workload, &Placement::single(0));
        let planner = Planner::new(&model, &workload, &program);
        for (u, unit) in program.units.iter().enumerate() {
            let loaded = program.ops[..program.load_ops]
                .iter()
                .filter(|op| matches!(op, Op::Alloc(a) if a.unit == Some(u) && a.component == vramplan_sim::program::Component::Weights))
                .count();
            assert_eq!(loaded, planner.held[u].len(), "{} {}: {:?}", model.name, unit.path, planner.held[u]);
        }
    }
}

/// A program planted with one weight of `transformer.h.0` on GPU 1 while the block computes
/// on GPU 0 stops at that block's first operation reading it, with PyTorch's message, and
/// gives every segment back on both GPUs.
#[test]
fn a_weight_on_another_gpu_stops_the_run_with_pytorchs_message() {
    let (mut program, _) = gpt2_training();
    let block = program.units.iter().position(|u| u.path == "transformer.h.0").unwrap();
    let first = program.ops[..program.load_ops]
        .iter()
        .position(|op| matches!(op, Op::Alloc(a) if a.unit == Some(block) && a.component == vramplan_sim::program::Component::Weights))
        .unwrap();
    let Op::Alloc(alloc) = &mut program.ops[first] else { unreachable!() };
    alloc.device = 1;
    let model = gpt2();
    let workload = training(2, 256);
    let ran = run_with_compute(&program, &model, &workload, &[0, 1], 64 << 30);
    match &ran.run.outcome {
        Outcome::RuntimeError { error, module, message, devices } => {
            assert_eq!(error, "device_mismatch");
            // The block's first tensor is `ln_1.weight`, read by its first operation.
            assert_eq!(module, "transformer.h.0.ln_1");
            assert!(
                message.starts_with(
                    "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!"
                ),
                "{message}"
            );
            assert_eq!(devices, &["cuda:1", "cuda:0"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(ran.held.iter().all(|h| h.borrow().is_empty()), "segments left");
}

/// The tiny Llama trained over two GPUs: at each boundary the hidden states (and in backward
/// their gradient) are copied into the program's handoff allocations, GPU to GPU, and the
/// run completes with every operand on its operation's GPU.
#[test]
fn hidden_states_cross_gpus_in_the_handoff_allocations() {
    let model = tiny_llama();
    let hardware = vramplan_profiles::hardware::load("2xh100-80gb").unwrap();
    let workload = training(2, 128);
    let entries = vec![
        ("model.embed_tokens".to_string(), Target::Gpu(0)),
        ("model.layers.0".to_string(), Target::Gpu(0)),
        ("model.layers.1".to_string(), Target::Gpu(1)),
        ("model.norm".to_string(), Target::Gpu(1)),
        ("model.rotary_emb".to_string(), Target::Gpu(1)),
        ("lm_head".to_string(), Target::Gpu(1)),
    ];
    let placement = Placement::from_entries(entries);
    let program = step_program(&model, &hardware, &workload, &placement);
    let predicted = vramplan_sim::estimate(&model, &hardware, &workload, &placement).unwrap();
    let ran = run_with_compute(&program, &model, &workload, &[0, 1], 64 << 30);
    assert_eq!(ran.run.outcome, Outcome::Completed, "skipped: {:?}", ran.stats.skipped);
    assert_inside_live_allocations(&program, &ran.calls);
    let copies: Vec<(u32, u32, u64)> = ran
        .calls
        .iter()
        .filter_map(|c| match c.call {
            Call::Copy { from_device, bytes, .. } => Some((from_device, c.device, bytes)),
            _ => None,
        })
        .collect();
    // Forward 0 → 1 and backward 1 → 0, in each of the two steps.
    let handoff = program.handoff_bytes;
    assert_eq!(copies, vec![(0, 1, handoff), (1, 0, handoff), (0, 1, handoff), (1, 0, handoff)]);
    for (measured, predicted) in ran.run.devices.iter().zip(&predicted.devices) {
        assert_eq!(measured.reserved_bytes, predicted.peak_reserved_bytes);
    }
}

/// Inference (prefill) runs the embedding, the memory-efficient attention over the KV cache and
/// the last token's logits, inside the program's allocations.
#[test]
fn a_prefill_runs_inside_the_kv_cache_and_working_set() {
    let model = tiny_llama();
    let hardware = vramplan_profiles::hardware::load("h100-80gb").unwrap();
    let workload = Workload { batch: 2, seq: 256, prompt: Some(128), ..Workload::default() };
    let program = step_program(&model, &hardware, &workload, &Placement::single(0));
    let ran = run_with_compute(&program, &model, &workload, &[0], 64 << 30);
    assert_eq!(ran.run.outcome, Outcome::Completed);
    assert_inside_live_allocations(&program, &ran.calls);
    let ran_kernels = launched(&ran.calls);
    for k in ["vp_embedding", "vp_rms_norm", "vp_rotary", "vp_attention", "vp_act_mul"] {
        assert!(ran_kernels.contains(k), "{k} never ran: {ran_kernels:?}; skipped {:?}", ran.stats.skipped);
    }
    // The head's GEMM: the last token of each sequence only.
    let head = ran.calls.iter().find_map(|c| match c.call {
        Call::Gemm(g) if g.m == 1000 => Some(g),
        _ => None,
    });
    assert_eq!(head.map(|g| g.n), Some(2));
}

/// A unit offloaded to the CPU in inference computes on the main GPU from the copies
/// accelerate streams there for its forward: its GEMMs read those allocations, made in its
/// span, not the load's.
#[test]
fn an_offloaded_unit_reads_the_weights_streamed_to_its_gpu() {
    let model = tiny_llama();
    let hardware = vramplan_profiles::hardware::load("h100-80gb").unwrap();
    let workload = Workload { batch: 2, seq: 256, ..Workload::default() };
    let entries = [
        "model.embed_tokens",
        "model.layers.0",
        "model.layers.1",
        "model.norm",
        "model.rotary_emb",
        "lm_head",
    ]
    .map(|m| (m.to_string(), if m == "model.layers.1" { Target::Cpu } else { Target::Gpu(0) }));
    let program = step_program(&model, &hardware, &workload, &Placement::from_entries(entries.to_vec()));
    let layer = program.units.iter().position(|u| u.path == "model.layers.1").unwrap();
    let streamed: BTreeSet<AllocId> = program.ops[program.load_ops..]
        .iter()
        .filter_map(|op| match op {
            Op::Alloc(a)
                if a.unit == Some(layer) && a.component == vramplan_sim::program::Component::Weights =>
            {
                Some(a.id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(streamed.len(), 9, "two norms and seven linear weights streamed");
    let ran = run_with_compute(&program, &model, &workload, &[0], 64 << 30);
    assert_eq!(ran.run.outcome, Outcome::Completed);
    assert_inside_live_allocations(&program, &ran.calls);
    let weights_read: BTreeSet<AllocId> = ran
        .calls
        .iter()
        .filter(|c| matches!(c.call, Call::Gemm(_)))
        .map(|c| c.touched[1].alloc)
        .filter(|id| streamed.contains(id))
        .collect();
    assert_eq!(weights_read.len(), 7, "each linear layer of the offloaded block reads its own copy");
}
