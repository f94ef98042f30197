//! accelerate's CPU offload in inference: a module placed on `cpu` keeps its weights in host
//! memory and runs on the map's first GPU, which holds its KV cache for the whole generation
//! and a copy of its weights while it runs (`AlignDevicesHook` with offload). Figures are
//! Llama-2-7B's from its published config: hidden 4096, 32 layers, 32 KV heads of 128,
//! intermediate 11008, vocabulary 32000, fp16.

use vramplan_profiles::model::{self, ImportOptions};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::workload::{Mode, Workload};
use vramplan_sim::{Placement, Target, estimate};

const HIDDEN: u64 = 4096;
const LAYERS: u64 = 32;
/// fp16 bytes of one decoder layer: q, k, v, o (4·h²), gate, up, down (3·h·11008), two norms.
const LAYER_BYTES: u64 = 2 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * 11008 + 2 * HIDDEN);
const EMBEDDING_BYTES: u64 = 2 * 32000 * HIDDEN;

#[test]
fn offloaded_layers_keep_their_kv_cache_and_run_on_the_first_gpu() {
    let model = model::load("llama-2-7b", ImportOptions::default()).expect("built-in");
    let hardware = hardware::load("a100-80gb").expect("profile");
    let (batch, seq) = (1, 4096);
    let workload =
        Workload { mode: Mode::Inference, batch, seq, weight_dtype: Some(DType::F16), ..Workload::default() };
    // The embedding and layers 0–15 on GPU 0; layers 16–31, the norm and the head on the CPU.
    let mut entries = vec![("model.embed_tokens".to_string(), Target::Gpu(0))];
    for i in 0..LAYERS {
        entries.push((format!("model.layers.{i}"), if i < 16 { Target::Gpu(0) } else { Target::Cpu }));
    }
    for rest in ["model.norm", "model.rotary_emb", "lm_head"] {
        entries.push((rest.to_string(), Target::Cpu));
    }
    let estimate =
        estimate(&model, &hardware, &workload, &Placement::from_entries(entries)).expect("estimate");
    assert_eq!(estimate.devices.len(), 1, "the CPU is not a device of the estimate");
    let gpu = &estimate.devices[0];
    // KV cache of all 32 layers, offloaded or not: 2 · layers · kv_heads · head_dim · seq ·
    // batch · 2 bytes = 2 GiB.
    let kv = 2 * LAYERS * 32 * 128 * seq * batch * 2;
    assert_eq!(gpu.components.kv_cache, kv);
    // Weights held: the embedding and 16 layers; at the peak one offloaded layer's copy more.
    let held = EMBEDDING_BYTES + 16 * LAYER_BYTES;
    assert!(gpu.components.weights <= held + LAYER_BYTES, "{}", gpu.components.weights);
    assert!(gpu.peak_allocated_bytes >= held + kv + LAYER_BYTES, "{}", gpu.peak_allocated_bytes);
    // And no more than that with a layer's activations (under 1 GiB here): the offloaded
    // layers' weights are copied one at a time, never all held.
    assert!(gpu.peak_allocated_bytes < held + LAYER_BYTES + kv + (1 << 30));
}
