//! Every llama.cpp export, replayed with llama.cpp's own rule for where each layer goes, must
//! give the plan's placement layer by layer. The rule is llama.cpp's, rewritten here
//! independently of the exporter (`src/llama-model.cpp`, `llama_model::load_tensors`):
//!
//! - `-ts` values are made cumulative and normalised: `splits[i] = Σ_{j ≤ i} ts[j] / Σ ts`;
//! - `i_gpu_start = max(n_layer − ngl, 0)`, `act_gpu_layers = min(ngl, n_layer + 1)`;
//! - slot `il` (the layers `0..n_layer`, then the output layer as `il = n_layer`) is on the CPU
//!   when `il < i_gpu_start` or `il − i_gpu_start ≥ act_gpu_layers`, else on GPU
//!   `upper_bound(splits, float(il − i_gpu_start) / act_gpu_layers)`, in `float` (f32);
//! - `-ot REGEX=BUFFER` then moves the tensors whose names match to that buffer.

use vramplan_tests::vramplan;

/// Where llama.cpp puts a slot: a GPU index, or `None` for the CPU.
type Slot = Option<usize>;

/// llama.cpp's placement of the `n_layer + 1` slots for `-ngl ngl -ts ts`.
fn llamacpp_slots(n_layer: usize, ngl: usize, ts: &[f32]) -> Vec<Slot> {
    let mut splits: Vec<f32> = Vec::with_capacity(ts.len());
    let mut sum = 0.0f32;
    for t in ts {
        sum += t;
        splits.push(sum);
    }
    for s in &mut splits {
        *s /= sum;
    }
    let i_gpu_start = n_layer.saturating_sub(ngl);
    let act_gpu_layers = ngl.min(n_layer + 1);
    (0..=n_layer)
        .map(|il| {
            if il < i_gpu_start || il - i_gpu_start >= act_gpu_layers {
                return None;
            }
            let x = (il - i_gpu_start) as f32 / act_gpu_layers as f32;
            // std::upper_bound: the first split greater than x.
            Some(splits.iter().position(|&s| x < s).unwrap_or(splits.len()))
        })
        .collect()
}

/// The flags of an export: `-ngl`, `-ts` (one GPU when absent), `-ot` overrides.
struct Flags {
    ngl: usize,
    ts: Vec<f32>,
    /// `(layers, buffer)` of each `-ot "blk\.(a|b)\.ffn_.*_exps\.=BUFFER"`.
    overrides: Vec<(Vec<usize>, Slot)>,
    /// The buffer of `-ot "^output\.=BUFFER"`, if given.
    output: Option<Slot>,
}

fn parse_flags(text: &str) -> Flags {
    let words: Vec<&str> = text.split_whitespace().collect();
    let value = |flag: &str| words.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
    let ngl = value("-ngl").expect("-ngl").parse().expect("-ngl is a number");
    let ts = value("-ts").map_or(vec![1.0], |v| v.split(',').map(|x| x.parse().expect("-ts")).collect());
    let buffer_slot =
        |buffer: &str| -> Slot { buffer.strip_prefix("CUDA").map(|g| g.parse().expect("CUDA index")) };
    let mut overrides = Vec::new();
    let mut output = None;
    for w in words.windows(2).filter(|w| w[0] == "-ot") {
        let spec = w[1].trim_matches('"');
        let (pattern, buffer) = spec.rsplit_once('=').expect("REGEX=BUFFER");
        if pattern == "^output\\." {
            output = Some(buffer_slot(buffer));
            continue;
        }
        let list = pattern
            .strip_prefix("blk\\.(")
            .and_then(|p| p.split_once(')'))
            .map(|(l, _)| l)
            .expect("a layer list");
        let layers = list.split('|').map(|l| l.parse().expect("layer")).collect();
        overrides.push((layers, buffer_slot(buffer)));
    }
    Flags { ngl, ts, overrides, output }
}

/// The plan's own placement: per layer (`blk.N`), per layer's experts, and the output.
struct Planned {
    /// Per layer index, where the plan puts it (`None` inside: a layer the map leaves out).
    layers: Vec<Option<Slot>>,
    experts: Vec<(usize, Slot)>,
    output: Slot,
}

fn slot_of(value: &serde_json::Value) -> Slot {
    match value {
        serde_json::Value::Number(n) => Some(n.as_u64().expect("GPU index") as usize),
        _ => None,
    }
}

fn planned(json: &serde_json::Value) -> Planned {
    let map = json["device_map"].as_object().expect("device_map");
    let mut layers = Vec::new();
    let mut experts = Vec::new();
    let mut output = None;
    for (name, device) in map {
        if name == "output" {
            output = slot_of(device);
        } else if let Some(rest) = name.strip_prefix("blk.") {
            match rest.split_once('.') {
                Some((i, _)) => experts.push((i.parse().expect("layer"), slot_of(device))),
                None => {
                    let i: usize = rest.parse().expect("layer");
                    if layers.len() <= i {
                        layers.resize(i + 1, None);
                    }
                    layers[i] = Some(slot_of(device));
                }
            }
        }
    }
    Planned { layers, experts, output }
}

/// Plans, exports, replays; returns the flags text.
fn replay(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("flags.txt");
    let file_arg = file.display().to_string();
    let mut full = vec!["plan"];
    full.extend(args);
    full.extend(["--target", "llama.cpp", "--engine", "llama.cpp", "--mode", "inference", "--json"]);
    let out = vramplan(&full);
    assert_eq!(out.code, 0, "{args:?}:\n{}\n{}", out.stdout, out.stderr);
    let plan = planned(&out.json());
    full.extend(["-o", &file_arg]);
    let written = vramplan(&full);
    assert_eq!(written.code, 0, "{}", written.stderr);
    let text = std::fs::read_to_string(&file).expect("flags written");
    let flags = parse_flags(&text);
    // The layer count from the model itself, not from the map under test, and every layer in it.
    let inspected = vramplan(&["inspect", args[0], "--json"]);
    let n_layer = inspected.json()["layers"].as_u64().expect("layers") as usize;
    assert_eq!(plan.layers.len(), n_layer, "{args:?}: the plan lists {} layers", plan.layers.len());
    let missing: Vec<usize> = (0..n_layer).filter(|&i| plan.layers[i].is_none()).collect();
    assert!(missing.is_empty(), "{args:?}: layers {missing:?} are not in the plan");
    let layers: Vec<Slot> = plan.layers.iter().flatten().copied().collect();
    let slots = llamacpp_slots(n_layer, flags.ngl, &flags.ts);
    assert_eq!(&slots[..n_layer], &layers[..], "{args:?}: `{}` places the layers otherwise", text.trim());
    let output = flags.output.unwrap_or(slots[n_layer]);
    assert_eq!(output, plan.output, "{args:?}: `{}` places the output layer otherwise", text.trim());
    for (layer, device) in &plan.experts {
        let moved = flags.overrides.iter().find(|(layers, _)| layers.contains(layer));
        let replayed = moved.map_or(slots[*layer], |(_, buffer)| *buffer);
        assert_eq!(replayed, *device, "{args:?}: experts of layer {layer} under `{}`", text.trim());
    }
    text
}

#[test]
fn llama_3_8b_q4_on_two_t4s_splits_as_planned() {
    // The case of issue 9: 32 layers and the output over two T4s. `-ts 18,14` would give GPU 0
    // nineteen slots (llama.cpp splits 33 slots, not 32).
    let text = replay(&["llama-3-8b", "--hardware", "t4x2", "--quant", "Q4_K_M"]);
    assert!(text.contains("-ngl 33"), "{text}");
}

#[test]
fn uneven_splits_over_three_and_four_gpus_replay_exactly() {
    replay(&["llama-2-13b", "--hardware", "3xt4", "--quant", "Q4_K_M", "--seq", "8192"]);
    replay(&["qwen2.5-32b", "--hardware", "4xt4", "--quant", "Q5_K_M", "--seq", "4096"]);
    replay(&["llama-3-70b", "--hardware", "rtx4090+rtx3090", "--quant", "Q3_K_M", "--seq", "2048"]);
}

#[test]
fn partial_offload_keeps_the_first_layers_on_the_cpu() {
    // 70B in Q4 (about 40 GB) on one 24 GB card: the first layers stay on the CPU.
    let text = replay(&["llama-2-70b", "--hardware", "rtx4090", "--quant", "Q4_K_M", "--seq", "4096"]);
    let flags = parse_flags(&text);
    assert!(flags.ngl < 81, "{text}");
}

#[test]
fn moe_experts_moved_by_override_tensor_replay_exactly() {
    replay(&["mixtral-8x7b", "--hardware", "t4x2", "--quant", "Q4_K_M", "--seq", "4096"]);
    replay(&["qwen3-30b-a3b", "--hardware", "rtx4090", "--quant", "Q4_K_M", "--seq", "8192"]);
}

#[test]
fn the_rule_itself_matches_the_issue_arithmetic() {
    // 32 layers, -ngl 33 -ts 18,14: GPU 0 gets slots 0..=18 (19); with -ts 18,15 it gets 18.
    let count = |ts: &[f32]| llamacpp_slots(32, 33, ts).iter().filter(|s| **s == Some(0)).count();
    assert_eq!(count(&[18.0, 14.0]), 19);
    assert_eq!(count(&[18.0, 15.0]), 18);
    // -ngl 20 on 32 layers: layers 0..12 on the CPU, 12..32 on the GPU, the output on the CPU
    // (it is a GPU slot only once every layer is).
    let slots = llamacpp_slots(32, 20, &[1.0]);
    assert!(slots[..12].iter().all(Option::is_none) && slots[12..32].iter().all(|s| *s == Some(0)));
    assert_eq!(slots[32], None);
}
