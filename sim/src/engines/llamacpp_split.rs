//! llama.cpp's buffers on each device when it spreads a model's layers over several GPUs
//! (`--split-mode layer`): per GPU its model buffer (`CUDAn model buffer size`), the KV cache of
//! its layers (`CUDAn KV buffer size`) and its compute buffer (`CUDAn compute buffer size`); the
//! host keeps the input layer and whatever stays on the CPU.
//!
//! - **Placement.** [`LayerPlacement::default_split`] is what llama.cpp does with no `-ngl`,
//!   `-ts` or `-ot`: every layer offloaded, split in proportion to each GPU's free memory, the
//!   output layer with the last slot ([`super::layer_split`]). A device map or a
//!   `--target llama.cpp` plan gives its own ([`LayerPlacement::from_placement`]).
//! - **Model buffer.** A layer's tensors go to its device (`dev_layer`), routed experts to where
//!   `-ot` moves them, `output` and `output_norm` to the output layer's device (`dev_output`); the
//!   token embedding (and position embeddings) to the host (`dev_input`). A tied output is a copy
//!   of `token_embd` on the output layer's device. Sizes as in [`super::llamacpp`].
//! - **KV cache.** With the KV cache offloaded (llama.cpp's default, `offload_kqv`), each layer's
//!   K and V are allocated on the device of that layer (`llama_kv_cache` constructor,
//!   `model.dev_layer(il)`).
//! - **Compute buffer.** `ggml_backend_sched` splits the graph by backend and sizes one buffer per
//!   backend for the stages it runs ([`super::llamacpp::compute_buffer_share`]). With more than
//!   one device, every layer offloaded and no tensor override, `llama_context` creates the
//!   scheduler with pipeline parallelism, which keeps [`super::llamacpp::PIPELINE_COPIES`] copies
//!   of every input a device receives.
//!
//! Not modelled: `--fit` (on by default in recent llama-server; it keeps this placement when every
//! device keeps its `--fit-target` free and otherwise changes `-c`, `-ngl` and `-ts`, which
//! `vramplan plan --target llama.cpp` answers instead), `--split-mode row`, and the compute
//! buffer a GPU needs to run layers left on the CPU (`op_offload`).

use super::gguf::{self, FileType, Role};
use super::layer_split;
use super::llamacpp::{self, GraphShare, PIPELINE_COPIES};
use crate::placement::{Placement, Target};
use crate::workload::Workload;
use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, ModuleKind};

/// Where llama.cpp holds each part of the model: a GPU index, or `None` for the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerPlacement {
    /// Per layer of the model (in `facts.layers` order), the GPU holding its tensors.
    pub layers: Vec<Option<u32>>,
    /// Per layer, the GPU holding its routed experts' tensors (the layer's own unless `-ot`
    /// moves them).
    pub experts: Vec<Option<u32>>,
    /// The GPU of the output layer (`output`, `output_norm`).
    pub output: Option<u32>,
}

impl LayerPlacement {
    /// llama.cpp's default placement on `hardware`: every layer and the output layer offloaded
    /// (`-ngl` all), the `n_layer + 1` slots split over the GPUs in proportion to their free
    /// memory (the profile's usable bytes: total less the driver and CUDA-context reserves, as
    /// `cudaMemGetInfo` reports once the context exists). No GPU leaves everything on the host.
    pub fn default_split(model: &ModelDescription, hardware: &HardwareProfile) -> LayerPlacement {
        let free: Vec<f64> = hardware.devices.iter().map(|d| d.usable_bytes() as f64).collect();
        let points = layer_split::split_points(&free);
        let n_layer = model.facts.layers.len();
        let slots = layer_split::slots(n_layer, None, &points);
        let gpu = |slot: Option<usize>| slot.map(|i| hardware.devices.get(i).map_or(i as u32, |d| d.index));
        let layers: Vec<Option<u32>> = slots[..n_layer].iter().map(|s| gpu(*s)).collect();
        LayerPlacement { experts: layers.clone(), layers, output: gpu(slots[n_layer]) }
    }

    /// The placement a device map or a `--target llama.cpp` plan gives: a layer by its GGUF
    /// name (`blk.N`, as plans write it) or else its module path (as accelerate maps write it);
    /// its routed experts by `blk.N.ffn_*_exps` or the experts module's path, else with the
    /// layer; the output layer by `output` or the LM head's path, else with the last layer.
    /// `cpu` and `disk` are the host.
    pub fn from_placement(model: &ModelDescription, placement: &Placement) -> LayerPlacement {
        let exact = |key: &str| placement.entries().iter().find(|(k, _)| k == key).map(|(_, t)| *t);
        let on = |target: Option<Target>| match target {
            Some(Target::Gpu(g)) => Some(g),
            _ => None,
        };
        let mut layers = Vec::new();
        let mut experts = Vec::new();
        for (i, layer) in model.facts.layers.iter().enumerate() {
            let target = exact(&format!("blk.{i}")).or_else(|| placement.target_of(&layer.path));
            let experts_target = exact(&format!("blk.{i}.ffn_*_exps"))
                .or_else(|| experts_path(model, &layer.path).and_then(|p| placement.target_of(&p)))
                .or(target);
            layers.push(on(target));
            experts.push(on(experts_target));
        }
        let output = exact("output")
            .or_else(|| crate::model::units::head_path(model).and_then(|p| placement.target_of(&p)))
            .map_or_else(|| layers.last().copied().flatten(), |t| on(Some(t)));
        LayerPlacement { layers, experts, output }
    }

    /// Tensors placed apart from their layer (`-ot`): experts elsewhere, or a GPU-held output
    /// layer while some layer stays on the host (a slot llama.cpp's split cannot give).
    fn has_overrides(&self) -> bool {
        let experts_moved = self.layers.iter().zip(&self.experts).any(|(l, e)| l != e);
        let output_moved = self.output.is_some() && self.layers.iter().any(Option::is_none);
        experts_moved || output_moved
    }
}

/// The routed-experts module of the block at `layer_path`, if it has one.
fn experts_path(model: &ModelDescription, layer_path: &str) -> Option<String> {
    let mut found = None;
    model.root.find(layer_path)?.visit(&mut |m| {
        if found.is_none() && matches!(m.kind, ModuleKind::Experts { .. }) {
            found = Some(m.path.clone());
        }
    });
    found
}

/// One GPU's llama.cpp buffers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceBuffers {
    /// The GPU's index in the hardware profile.
    pub gpu: u32,
    /// Layers whose tensors it holds.
    pub layers: u32,
    /// It holds the output layer.
    pub output: bool,
    /// Its model buffer: its tensors, padded and aligned as the CUDA buffer type places them.
    pub model_bytes: u64,
    /// The KV cache of its layers.
    pub kv_bytes: u64,
    /// Its compute buffer.
    pub compute_bytes: u64,
    /// The graph stage that sets the compute buffer.
    pub compute_peak_at: String,
}

impl DeviceBuffers {
    /// Everything llama.cpp allocates on the GPU beyond its CUDA context.
    pub fn gpu_bytes(&self) -> u64 {
        self.model_bytes.saturating_add(self.kv_bytes).saturating_add(self.compute_bytes)
    }
}

/// llama.cpp's buffers for a placement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SplitBudget {
    /// The GGUF file type of the weights.
    pub file_type: FileType,
    /// Every GPU that holds a buffer, ascending.
    pub devices: Vec<DeviceBuffers>,
    /// Model tensors in host memory (the input layer, layers left on the CPU).
    pub host_model_bytes: u64,
    /// KV cache of the layers left on the CPU.
    pub host_kv_bytes: u64,
    /// The scheduler keeps [`PIPELINE_COPIES`] copies of each device's inputs.
    pub pipeline_parallel: bool,
}

/// llama.cpp's buffers for `model` placed by `placement` on `hardware` under `workload`, whose
/// engine must be llama.cpp.
pub fn split_budget(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &LayerPlacement,
) -> Result<SplitBudget, InputError> {
    let settings = llamacpp::settings(model, workload)?;
    if let Some(gpu) = placement
        .layers
        .iter()
        .chain(&placement.experts)
        .chain([&placement.output])
        .flatten()
        .find(|g| !hardware.devices.iter().any(|d| d.index == **g))
    {
        return Err(InputError::new(
            "--device-map",
            format!("GPU {gpu} is not in the hardware profile `{}`", hardware.name),
        )
        .with_fix(format!("the profile has GPUs 0 to {}", hardware.devices.len().saturating_sub(1))));
    }
    let tensors = gguf::quantize(model, settings.file_type)?;
    let mut model_bytes: Vec<(u32, u64)> = Vec::new();
    let mut host_model_bytes = 0u64;
    let mut add = |device: Option<u32>, tensor: &gguf::GgufTensor| match device {
        Some(gpu) => match model_bytes.iter_mut().find(|(g, _)| *g == gpu) {
            Some((_, bytes)) => *bytes = bytes.saturating_add(llamacpp::cuda_alloc_size(tensor)),
            None => model_bytes.push((gpu, llamacpp::cuda_alloc_size(tensor))),
        },
        None => host_model_bytes = host_model_bytes.saturating_add(tensor.bytes),
    };
    let tied = !tensors.iter().any(|t| t.role == Role::Output);
    for tensor in &tensors {
        match tensor.layer.map(|l| l as usize) {
            Some(l) if l < placement.layers.len() => {
                let experts = tensor.path.contains(".experts.");
                add(if experts { placement.experts[l] } else { placement.layers[l] }, tensor);
            }
            _ if tensor.role == Role::TokenEmbedding => {
                add(None, tensor);
                if tied && placement.output.is_some() {
                    // `output` is duplicated from `token_embd` on the output layer's device.
                    add(placement.output, tensor);
                }
            }
            _ if is_input_embedding(model, &tensor.path) => add(None, tensor),
            _ => add(placement.output, tensor),
        }
    }

    let all_offloaded = placement.layers.iter().all(Option::is_some) && placement.output.is_some();
    let pipeline_parallel = hardware.devices.len() > 1 && all_offloaded && !placement.has_overrides();
    let copies = if pipeline_parallel { PIPELINE_COPIES } else { 1 };
    let llamacpp::Settings { n_ctx, n_ubatch, kv_dtype, flash_attention, .. } = settings;
    let layer_kv = |i: usize| llamacpp::layer_kv_bytes(model, i, n_ctx, n_ubatch, kv_dtype);
    let host_kv_bytes =
        (0..placement.layers.len()).filter(|&i| placement.layers[i].is_none()).map(layer_kv).sum();
    let mut devices = Vec::new();
    for device in &hardware.devices {
        let gpu = device.index;
        let held: Vec<usize> =
            (0..placement.layers.len()).filter(|&i| placement.layers[i] == Some(gpu)).collect();
        let output = placement.output == Some(gpu);
        let weights = model_bytes.iter().find(|(g, _)| *g == gpu).map_or(0, |(_, b)| *b);
        if held.is_empty() && !output && weights == 0 {
            continue;
        }
        let kv_bytes = held.iter().map(|&i| layer_kv(i)).sum();
        // A GPU holding only some layers' experts (`-ot`) runs their feed-forward.
        let runs_layers = !held.is_empty() || placement.experts.contains(&Some(gpu));
        let share = GraphShare { layers: runs_layers, output, copies };
        let (compute_bytes, at) =
            llamacpp::compute_buffer_share(model, n_ctx, n_ubatch, flash_attention, share);
        devices.push(DeviceBuffers {
            gpu,
            layers: held.len() as u32,
            output,
            model_bytes: weights,
            kv_bytes,
            compute_bytes,
            compute_peak_at: at.to_string(),
        });
    }
    Ok(SplitBudget {
        file_type: settings.file_type,
        devices,
        host_model_bytes,
        host_kv_bytes,
        pipeline_parallel,
    })
}

/// A tensor of an embedding module other than the token embedding (position or token-type
/// embeddings): part of the input layer, which llama.cpp keeps on the host.
fn is_input_embedding(model: &ModelDescription, tensor_path: &str) -> bool {
    let module = tensor_path.rsplit_once('.').map_or("", |(m, _)| m);
    model.root.find(module).is_some_and(|m| m.kind == ModuleKind::Embedding)
}
