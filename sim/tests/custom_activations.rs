//! Declared activations of custom models against closed forms taken from the user's own figures:
//! a module declaring `per_token` P and `per_sample` S, trained at batch b and sequence s
//! without checkpointing, keeps exactly b·s·P + b·S bytes from its forward to its backward
//! (autograd's saved tensors), which scale linearly with the batch; a checkpointed block keeps
//! its input and recomputes its declaration in backward; inference holds the declaration only
//! while the module runs; a model without a vocabulary is charged no logits. The seed models
//! are the examples of `docs/examples/` (a time-series transformer, a graph network, XLNet with
//! a memory mixture).

use std::path::PathBuf;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::program::{Component, Op, StepProgram, step_program};
use vramplan_sim::workload::{GradCheckpointing, Mode, Parallelism, Workload};
use vramplan_sim::{Placement, estimate};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn example(name: &str) -> ModelDescription {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples").join(name);
    model::load(path.to_str().unwrap(), ImportOptions::default()).expect("example model")
}

/// A custom model from YAML text, written to a file of its own in the temporary folder.
fn custom(name: &str, yaml: &str) -> ModelDescription {
    let path = std::env::temp_dir().join(format!("vramplan-{}-{name}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    let model = model::load(path.to_str().unwrap(), ImportOptions::default());
    let _ = std::fs::remove_file(&path);
    model.expect("custom model")
}

fn profile(name: &str) -> HardwareProfile {
    hardware::load(name).expect("built-in profile")
}

fn train(batch: u64, seq: u64) -> Workload {
    Workload { mode: Mode::Train, batch, seq, ..Workload::default() }
}

/// Bytes the first training step's forward allocates for `unit` as kept activations (the
/// allocations of its forward, transients included, in order).
fn forward_activations(program: &StepProgram, unit: &str) -> Vec<u64> {
    let index = program.units.iter().position(|u| u.path == unit).unwrap_or_else(|| panic!("no unit {unit}"));
    let mut in_forward = false;
    let mut out = Vec::new();
    for op in &program.ops {
        match op {
            Op::Compute(c) => {
                in_forward = matches!(c.event, vramplan_sim::program::Event::Forward(u, 1) if u == index)
            }
            Op::Alloc(a) if in_forward && a.component == Component::Activations => out.push(a.bytes),
            _ => {}
        }
    }
    out
}

/// The time-series transformer declares 6 KiB per token for each of its three encoder layers
/// and nothing else: at the step's peak (the last layer's backward, where every layer's saved
/// tensors are still held) the activations are exactly 3·b·s·6 KiB, linear in the batch, and no
/// logits (the model has no vocabulary). The formula for a 128-wide transformer layer would give
/// another figure (the seed's complaint).
#[test]
fn time_series_transformer_follows_its_declared_per_token_size() {
    let model = example("timeseries-transformer.yaml");
    let hw = profile("rtx4090");
    let seq = 512;
    let mut figures = Vec::new();
    for batch in [8, 32, 64] {
        let e = estimate(&model, &hw, &train(batch, seq), &Placement::single(0)).unwrap();
        let d = &e.devices[0];
        let declared = 3 * batch * seq * 6 * KIB;
        assert_eq!(d.components.activations, declared, "batch {batch}");
        assert_eq!(d.components.logits, 0, "no vocabulary, no logits");
        assert_eq!(d.peak_at, "backward of encoder.layers.2 (step 2)");
        assert!(d.fits);
        figures.push(d.components.activations);
    }
    assert_eq!(figures[1], 4 * figures[0]);
    assert_eq!(figures[2], 8 * figures[0]);
    // Per token: half the sequence, half the bytes.
    let half = estimate(&model, &hw, &train(8, 256), &Placement::single(0)).unwrap();
    assert_eq!(half.devices[0].components.activations, figures[0] / 2);
}

/// The graph network declares 96 MiB per graph for each of its six layers: b·96 MiB each,
/// whatever the sequence (a graph has none), on every rank of a four-GPU DDP run.
#[test]
fn graph_network_follows_its_declared_per_sample_size() {
    let model = example("graph-network.yaml");
    let batch = 8;
    let one = estimate(&model, &profile("a10g"), &train(batch, 1), &Placement::single(0)).unwrap();
    assert_eq!(one.devices[0].components.activations, 6 * batch * 96 * MIB);
    assert_eq!(one.devices[0].components.logits, 0);
    let longer = estimate(&model, &profile("a10g"), &train(batch, 4), &Placement::single(0)).unwrap();
    assert_eq!(longer.devices[0].components.activations, 6 * batch * 96 * MIB, "per sample, not per token");
    let ddp = Workload { parallelism: Parallelism::Ddp, ..train(batch, 1) };
    let ranks = estimate(&model, &profile("4xa10g"), &ddp, &Placement::single(0)).unwrap();
    assert_eq!(ranks.devices.len(), 4);
    for d in &ranks.devices {
        assert_eq!(d.components.activations, 6 * batch * 96 * MIB, "GPU {}", d.id);
        assert!(d.fits);
    }
}

/// Both sizes at once, one allocation per declaring module of b·s·P + b·S bytes, made in the
/// module's forward; a norm outside the blocks that declares sizes is charged them in place of
/// the norm's own tensors, and a container declaring sizes over two linears (units of their
/// own) is charged to the first of them.
#[test]
fn each_declaring_module_allocates_its_closed_form_in_its_forward() {
    let model = custom(
        "mixed",
        "\
name: mixed
hidden_size: 64
activations: {per_token: 4KiB, per_sample: 1MiB}
modules:
  - name: embed
    linear: {in: 8, out: 64}
  - name: layers
    repeat: 2
    modules:
      - name: proj
        linear: {in: 64, out: 64}
  - name: final_norm
    norm: {dim: 64}
    activations: {per_token: 1KiB}
  - name: readout
    activations: {per_sample: 3MiB}
    modules:
      - name: lin1
        linear: {in: 64, out: 64}
      - name: lin2
        linear: {in: 64, out: 1}
",
    );
    let (batch, seq) = (4, 256);
    let program = step_program(&model, &profile("a10g"), &train(batch, seq), &Placement::single(0));
    let block = batch * seq * 4 * KIB + batch * MIB;
    for layer in ["layers.0", "layers.1"] {
        assert_eq!(forward_activations(&program, layer), vec![block], "{layer}");
    }
    assert_eq!(forward_activations(&program, "final_norm"), vec![batch * seq * KIB]);
    assert_eq!(forward_activations(&program, "readout.lin1"), vec![batch * 3 * MIB]);
    assert_eq!(forward_activations(&program, "readout.lin2"), Vec::<u64>::new());
    assert_eq!(forward_activations(&program, "embed"), Vec::<u64>::new());
}

/// Full checkpointing: each block keeps only its input, the hidden states handed to it (h
/// values per token, fp32 here), and recomputes its declaration in backward, one block at a
/// time: at the peak, the three layers' inputs and one layer's declaration. The replay charges
/// what PyTorch's caching allocator charges: a block reused whole when less than 1 MiB of it
/// would remain (`kSmallSize`, c10/cuda/CUDACachingAllocator.cpp), so up to 1 MiB more per
/// allocation over 1 MiB.
#[test]
fn a_checkpointed_declaring_block_keeps_its_input_and_recomputes_its_declaration() {
    let model = example("timeseries-transformer.yaml");
    let (batch, seq) = (8, 512);
    let workload = Workload { grad_checkpointing: GradCheckpointing::Full, ..train(batch, seq) };
    let input = 4 * 128 * batch * seq;
    let declared = batch * seq * 6 * KIB;
    let program = step_program(&model, &profile("rtx4090"), &workload, &Placement::single(0));
    for layer in ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"] {
        // The kept input, then the working set while the layer runs without keeping anything.
        assert_eq!(forward_activations(&program, layer), vec![input, declared], "{layer}");
    }
    let e = estimate(&model, &profile("rtx4090"), &workload, &Placement::single(0)).unwrap();
    let at_peak = e.devices[0].components.activations;
    let expected = 3 * input + declared;
    assert!((expected..=expected + 4 * MIB).contains(&at_peak), "{at_peak} for {expected}");
    assert_eq!(e.devices[0].peak_at, "backward of encoder.layers.2 (step 2)");
}

/// Inference keeps nothing for backward: a declaring block holds its declaration for the
/// prompt's tokens while it runs, then frees it.
#[test]
fn inference_holds_a_declaration_only_while_its_module_runs() {
    let model = example("timeseries-transformer.yaml");
    let workload = Workload { mode: Mode::Inference, batch: 8, seq: 512, ..Workload::default() };
    let e = estimate(&model, &profile("rtx4090"), &workload, &Placement::single(0)).unwrap();
    let d = &e.devices[0];
    assert_eq!(d.components.activations, 8 * 512 * 6 * KIB);
    assert!(d.peak_at.starts_with("prefill of encoder.layers."), "{}", d.peak_at);
    assert_eq!(d.components.logits, 0);
}

/// XLNet-base extended with a memory mixture declaring 26 KiB per token: its twelve XLNet layers
/// keep what the memory model gives XLNet-base's, and the mixture exactly b·s·26 KiB; at the
/// peak, the loss (the model keeps XLNet's LM head, so it has logits), that is what it adds,
/// give or take the caching allocator's unsplit remainders (≤ 1 MiB per large allocation, in
/// either model: a few MiB either way).
#[test]
fn xlnet_memory_mixture_adds_exactly_its_declaration() {
    let hw = profile("t4");
    let base = model::load("xlnet-base-cased", ImportOptions::default()).unwrap();
    let mixture = example("xlnet-memory-mixture.yaml");
    let (batch, seq) = (8, 512);
    let declared = batch * seq * 26 * KIB;
    let program = |m: &ModelDescription| step_program(m, &hw, &train(batch, seq), &Placement::single(0));
    let (base_program, mixture_program) = (program(&base), program(&mixture));
    assert_eq!(forward_activations(&mixture_program, "transformer.memory"), vec![declared]);
    for layer in 0..12 {
        let path = format!("transformer.layer.{layer}");
        assert_eq!(forward_activations(&mixture_program, &path), forward_activations(&base_program, &path));
    }
    let at = |m: &ModelDescription| estimate(m, &hw, &train(batch, seq), &Placement::single(0)).unwrap();
    let (base, mixture) = (at(&base), at(&mixture));
    let (b, m) = (&base.devices[0], &mixture.devices[0]);
    assert_eq!(b.peak_at, "loss (step 2)");
    assert_eq!(m.peak_at, b.peak_at);
    let added = m.components.activations - b.components.activations;
    assert!((declared - 2 * MIB..=declared + 2 * MIB).contains(&added), "{added} added for {declared}");
    assert_eq!(m.components.logits, b.components.logits);
    assert!(m.components.logits > 0);
}
