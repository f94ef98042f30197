//! Custom-model YAML: the two documented examples in `docs/examples/` (parameter counts worked
//! out by hand here), `extend:` adding exactly the extra modules to a base whose count comes from
//! a closed form or a published figure, and the errors a user meets, each with its file and
//! line/column.

use std::path::{Path, PathBuf};
use vramplan_profiles::model::custom::{self, ActivationSizes};
use vramplan_profiles::model::{ImportOptions, ModuleKind};
use vramplan_profiles::{DType, InputError, Location};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples").join(name)
}

/// Writes `yaml` to a temporary file and loads it.
fn load_text(yaml: &str) -> (tempfile::TempDir, Result<custom::CustomModel, InputError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.yaml");
    std::fs::write(&path, yaml).unwrap();
    let result = custom::load(&path, ImportOptions::default());
    (dir, result)
}

fn error(yaml: &str) -> InputError {
    let (dir, result) = load_text(yaml);
    let err = result.expect_err("the file must be refused");
    assert_eq!(err.origin, dir.path().join("model.yaml").display().to_string(), "names the file: {err}");
    err
}

fn line_of(err: &InputError) -> u64 {
    match err.location {
        Some(Location::LineColumn { line, .. }) => line,
        ref other => panic!("expected a line and column, found {other:?} in {err}"),
    }
}

fn linear(inp: u64, out: u64, bias: bool) -> u64 {
    inp * out + if bias { out } else { 0 }
}

#[test]
fn the_time_series_example_has_its_hand_counted_parameters() {
    let model = custom::load(&example("timeseries-transformer.yaml"), ImportOptions::default()).unwrap();
    let d = &model.description;
    let layer = linear(128, 384, true)
        + linear(128, 128, true)
        + linear(128, 512, true)
        + linear(512, 128, true)
        + 2 * (128 + 128);
    let expected = linear(16, 128, true) + 512 * 128 + 3 * layer + linear(128, 96, true);
    assert_eq!(expected, 674_912, "the figure the example's comment states");
    assert_eq!(d.params(), expected);
    assert_eq!(d.bytes(), expected * 4, "fp32");
    assert_eq!(d.dtype, DType::F32);
    let blocks: Vec<&str> = d.facts.layers.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(blocks, ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"]);
    let block = d.root.find("encoder.layers.1").unwrap();
    assert_eq!((block.kind, block.class.as_str()), (ModuleKind::Block, "TSTEncoderLayer"));
    assert!(d.root.tensor("encoder.layers.2.self_attn.in_proj.bias").is_some());
    assert_eq!((d.facts.hidden_size, d.facts.num_attention_heads, d.facts.head_dim), (128, 8, 16));
    let six_kib = ActivationSizes { per_token: 6 * 1024, per_sample: 0 };
    assert_eq!(model.activations, blocks.iter().map(|b| (b.to_string(), six_kib)).collect::<Vec<_>>());
}

/// Llama-3-8B's parameters in closed form from its config numbers: embeddings and head
/// `V·h` each, final norm `h`, and per layer `q, o: h·h`, `k, v: h·kv·d`, MLP `3·h·i`, two norms.
fn llama_3_8b_params() -> u64 {
    let (v, h, i, layers, kv_width) = (128_256u64, 4096u64, 14_336u64, 32u64, 8 * 128u64);
    2 * v * h + h + layers * (2 * h * h + 2 * h * kv_width + 3 * h * i + 2 * h)
}

#[test]
fn the_llama_memory_example_adds_exactly_the_memory_module() {
    assert_eq!(llama_3_8b_params(), 8_030_261_248, "Meta's published count");
    let model = custom::load(&example("llama-memory.yaml"), ImportOptions::default()).unwrap();
    let d = &model.description;
    let memory = 65_536 * 512 + 65_536 * 4096 + linear(4096, 1024, false) + linear(4096, 4096, false) + 4096;
    assert_eq!(memory, 322_965_504, "the figure the example's comment states");
    assert_eq!(d.params(), llama_3_8b_params() + memory);
    assert_eq!(d.root.find("model.memory").unwrap().params(), memory);
    // Execution order: the memory block runs right after block 15.
    let order: Vec<&str> = d.facts.layers.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(order.len(), 33);
    assert_eq!(&order[15..18], ["model.layers.15", "model.memory", "model.layers.16"]);
    // Tree order: after the block list, before the final norm.
    let model_children: Vec<&str> =
        d.root.find("model").unwrap().children.iter().map(|c| c.path.as_str()).collect();
    let at = model_children.iter().position(|p| *p == "model.memory").unwrap();
    assert_eq!(model_children[at - 1], "model.layers");
    assert_eq!(d.root.tensor("model.memory.values").unwrap().dtype, DType::BF16, "the base's dtype");
    assert_eq!(
        model.activations,
        [("model.memory".to_string(), ActivationSizes { per_token: 48 * 1024, per_sample: 0 })]
    );
}

#[test]
fn extending_a_builtin_adds_exactly_the_extra_parameters() {
    // EleutherAI's published count for pythia-2.8b (model card).
    const PYTHIA_2_8B: u64 = 2_775_208_960;
    let (_dir, result) = load_text(
        "extend: pythia-2.8b\n\
         modules:\n\
         \x20 - name: gpt_neox.adapter\n\
         \x20   block: true\n\
         \x20   activations: {per_sample: 2MiB}\n\
         \x20   modules:\n\
         \x20     - {name: down, linear: {in: 2560, out: 64}}\n\
         \x20     - {name: up, linear: {in: 64, out: 2560, bias: true}}\n",
    );
    let model = result.unwrap();
    let extra = linear(2560, 64, false) + linear(64, 2560, true);
    assert_eq!(model.description.params(), PYTHIA_2_8B + extra);
    assert_eq!(model.description.facts.layers.last().unwrap().path, "gpt_neox.adapter");
    assert_eq!(model.description.facts.layers.len(), 33);
    assert_eq!(model.activations[0].1, ActivationSizes { per_token: 0, per_sample: 2 * 1024 * 1024 });
}

const MINIMAL: &str =
    "hidden_size: 8\nmodules:\n  - name: layers\n    repeat: 2\n    linear: {in: 8, out: 8}\n";

#[test]
fn a_minimal_model_loads() {
    let (_dir, result) = load_text(MINIMAL);
    let model = result.unwrap().description;
    assert_eq!(model.params(), 2 * 64);
    assert_eq!(model.facts.layers.len(), 2);
}

#[test]
fn tied_tensors_count_once() {
    let (_dir, result) = load_text(
        "hidden_size: 16\nvocab_size: 50\nties:\n  head.weight: embed.weight\nmodules:\n\
         \x20 - {name: embed, embedding: {count: 50, dim: 16}}\n\
         \x20 - {name: blocks, repeat: 2, params: 100}\n\
         \x20 - {name: head, linear: {in: 16, out: 50}}\n",
    );
    let model = result.unwrap().description;
    assert_eq!(model.params(), 50 * 16 + 2 * 100);
    assert_eq!(model.tied_groups(), [["embed.weight".to_string(), "head.weight".to_string()]]);
    assert!(model.facts.tie_word_embeddings);
}

/// A tie of a tensor to itself, or ties that close a cycle, leave no tensor of the group to
/// hold its memory (the group would weigh 0 B): refused at the tie's line. A chain of ties is
/// followed to the tensor that holds the memory, which counts once.
#[test]
fn self_ties_and_cycles_are_refused_and_chains_count_once() {
    let model = |ties: &str| {
        format!(
            "hidden_size: 16\nvocab_size: 50\nties:\n{ties}modules:\n\
             \x20 - {{name: embed, embedding: {{count: 50, dim: 16}}}}\n\
             \x20 - {{name: blocks, repeat: 2, params: 100}}\n\
             \x20 - {{name: head, linear: {{in: 16, out: 50}}}}\n\
             \x20 - {{name: head2, linear: {{in: 16, out: 50}}}}\n"
        )
    };
    let err = error(&model("  head.weight: head.weight\n"));
    assert!(err.problem.contains("tied to itself"), "{err}");
    assert_eq!(line_of(&err), 4, "{err}");
    let err = error(&model("  head.weight: head2.weight\n  head2.weight: head.weight\n"));
    assert!(err.problem.contains("cycle"), "{err}");
    assert_eq!(line_of(&err), 5, "{err}");
    let (_dir, chained) = load_text(&model("  head2.weight: head.weight\n  head.weight: embed.weight\n"));
    let chained = chained.unwrap().description;
    // embed (50 × 16) once, the blocks; head and head2 tied to it, in one group.
    assert_eq!(chained.params(), 50 * 16 + 2 * 100);
    let group: Vec<String> = ["embed.weight", "head.weight", "head2.weight"].map(String::from).to_vec();
    assert_eq!(chained.tied_groups(), vec![group]);
}

#[test]
fn malformed_yaml_is_located() {
    let err = error("hidden_size: 8\nmodules:\n  - name: a\n   linear: {in: 1, out: 2}\n");
    assert!(err.problem.contains("malformed custom-model YAML"), "{err}");
    assert_eq!(line_of(&err), 4, "{err}");
}

#[test]
fn unknown_keys_are_refused_at_their_line() {
    let err = error("hidden_size: 8\nmodules:\n  - name: a\n    block: true\n    linaer: {in: 1, out: 2}\n");
    assert!(err.problem.contains("unknown field `linaer`"), "{err}");
    assert_eq!(line_of(&err), 5);
    let err = error("hidden_sise: 8\nmodules: []\n");
    assert!(err.problem.contains("hidden_sise"), "{err}");
    assert_eq!(line_of(&err), 1);
}

#[test]
fn a_module_without_shape_is_refused() {
    let err = error("hidden_size: 8\nmodules:\n  - name: layers\n    repeat: 2\n  - name: head\n");
    assert!(err.problem.contains("has no shape"), "{err}");
    assert_eq!(line_of(&err), 3);
    let err = error(
        "hidden_size: 8\nmodules:\n  - name: a\n    block: true\n    buffers:\n      pos: {dtype: fp32}\n",
    );
    assert!(err.problem.contains("missing field `shape`"), "{err}");
    assert_eq!(line_of(&err), 6);
}

#[test]
fn zero_layers_are_refused() {
    let err =
        error("hidden_size: 8\nmodules:\n  - name: layers\n    repeat: 0\n    linear: {in: 8, out: 8}\n");
    assert!(err.problem.contains("`repeat` must be a positive integer, found 0"), "{err}");
    assert_eq!(line_of(&err), 4);
    let err = error("hidden_size: 8\nmodules:\n  - name: head\n    linear: {in: 8, out: 8}\n");
    assert!(err.problem.contains("no blocks (zero layers)"), "{err}");
    assert_eq!(line_of(&err), 3);
}

#[test]
fn negative_and_unitless_sizes_are_refused() {
    let with_activation = |value: &str| {
        error(&format!(
            "hidden_size: 8\nactivations:\n  per_token: {value}\nmodules:\n  - name: l\n    repeat: 1\n    params: 10\n"
        ))
    };
    let err = with_activation("-4KiB");
    assert!(err.problem.contains("negative"), "{err}");
    assert_eq!(line_of(&err), 3);
    let err = with_activation("4096");
    assert!(err.problem.contains("no unit"), "{err}");
    assert!(err.fix.as_deref().unwrap_or("").contains("KiB"), "{err}");
    let err = error("hidden_size: 8\nmodules:\n  - name: l\n    repeat: 1\n    tensors:\n      w: [4, -2]\n");
    assert!(err.problem.contains("dimension -2"), "{err}");
    assert_eq!(line_of(&err), 6);
    let err = error("hidden_size: -8\nmodules:\n  - name: l\n    repeat: 1\n    params: 3\n");
    assert!(err.problem.contains("`hidden_size` must be a positive integer, found -8"), "{err}");
}

#[test]
fn extend_refuses_facts_unknown_blocks_and_existing_names() {
    let err = error("extend: pythia-2.8b\nhidden_size: 8\nmodules:\n  - {name: x, params: 4}\n");
    assert!(err.problem.contains("comes from the extended model"), "{err}");
    assert_eq!(line_of(&err), 2);
    let err =
        error("extend: pythia-2.8b\nmodules:\n  - name: x\n    after: gpt_neox.layers.99\n    params: 4\n");
    assert!(err.problem.contains("not a block"), "{err}");
    assert_eq!(line_of(&err), 4);
    // transformers 5.x names GPT-NeoX's head `lm_head` (4.x: `embed_out`).
    let err = error("extend: pythia-2.8b\nmodules:\n  - {name: lm_head, params: 4}\n");
    assert!(err.problem.contains("already exists"), "{err}");
    let err = error("extend: no-such-model.json\nmodules:\n  - {name: x, params: 4}\n");
    assert!(err.problem.contains("neither a built-in model"), "{err}");
    assert_eq!(line_of(&err), 1);
}
