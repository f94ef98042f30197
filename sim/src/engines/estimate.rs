//! The inference engines' budgets as an [`Estimate`]: one row per GPU the engine uses, placed the
//! way the engine places the model when no map or plan says otherwise.
//!
//! - **vLLM** shards over `--tensor-parallel-size` GPUs, whose default is 1: without
//!   `--parallel tp=N` it serves from one GPU (the first visible one) whatever the profile holds,
//!   and the estimate says so. With `--pipeline-parallel-size` (`pp=M`) it runs M such groups,
//!   each with its share of the layers ([`super::pipeline_stage`]).
//! - **SGLang** runs `--dp-size` replicas of a `--tp-size` group (`--parallel tp=N`, default 1):
//!   `tp × dp` GPUs, every rank with the same budget ([`sglang::budget`]).
//! - **llama.cpp** uses every GPU it sees: with no map or plan, its default layer split
//!   ([`LayerPlacement::default_split`]); with a device map or a `--target llama.cpp` plan, that
//!   placement ([`LayerPlacement::from_placement`]). Each GPU gets its model buffer, the KV cache
//!   of its layers and its compute buffer.

use super::llamacpp_split::{self, LayerPlacement};
use super::pipeline_stage::Stage;
use super::sglang;
use super::vllm;
use crate::estimate::{Components, DeviceEstimate, Estimate};
use crate::placement::Placement;
use crate::workload::Workload;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_profiles::units::format_bytes;

/// vLLM's estimate: the ranks of its `dp` replicas (`--data-parallel-size`) of `pp` pipeline
/// stages of `tp`-way tensor-parallel groups (`--parallel tp=N,pp=M`, else one GPU), rank
/// `(replica × pp + stage) × tp + i` on the profile's GPU of that index, as vLLM numbers them. The ranks of a stage have the same budget; the KV capacity is the
/// smallest stage's, since vLLM sizes every stage's cache to the same number of blocks.
pub fn vllm_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
) -> Result<Estimate, InputError> {
    let tp = workload.tensor_parallel_size();
    let pp = workload.pipeline_parallel_size();
    let dp = workload.data_parallel_size();
    if workload.vllm.enable_expert_parallel && model.facts.moe.is_none() {
        return Err(InputError::new(
            "--enable-expert-parallel",
            format!("{} is a dense model: it has no experts to spread", model.name),
        )
        .with_fix("leave out --enable-expert-parallel"));
    }
    let group = tp as usize * pp as usize;
    let ranks = group * dp as usize;
    if ranks > hardware.devices.len() {
        let mut layout = format!("tensor parallel {tp}");
        if pp > 1 {
            layout += &format!(" × pipeline parallel {pp}");
        }
        if dp > 1 {
            layout += &format!(" × {dp} data-parallel replicas");
        }
        return Err(InputError::new(
            "--parallel",
            format!("{layout} runs on {ranks} GPUs, but `{}` has {}", hardware.name, hardware.devices.len()),
        )
        .with_fix("use a profile with enough GPUs (e.g. `4xa100-80gb`), or a smaller tp, pp or --data-parallel-size"));
    }
    let budgets = hardware
        .devices
        .iter()
        .take(ranks)
        .enumerate()
        .map(|(rank, device)| {
            let stage = Stage { index: ((rank % group) / tp as usize) as u32, count: pp };
            vllm::stage_budget(model, device, workload, tp, stage)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // vLLM gives every rank the smallest rank's number of blocks (`get_kv_cache_configs`: "Change
    // the num_blocks of each rank to the smallest among all ranks"), and shrinks the others' caches.
    let capacity = budgets.iter().map(|b| b.kv_capacity_tokens).min().unwrap_or(0);
    let mut devices = Vec::new();
    for (device, b) in hardware.devices.iter().zip(&budgets) {
        let kv_cache = if b.kv_capacity_tokens > capacity {
            capacity.saturating_mul(b.kv_bytes_per_token)
        } else {
            b.kv_cache_bytes
        };
        // Outside torch: the non-torch memory profiling measured, the CUDA context and the
        // distributed environment from before the snapshot, and the CUDA graphs captured after.
        let overhead =
            b.non_torch_bytes + device.context_reserve_bytes + b.distributed_init_bytes + b.cuda_graph_bytes;
        let held = Held {
            weights: b.weights_bytes,
            activations: b.activation_peak_bytes,
            kv_cache,
            overhead,
            peak_at: b.activation_peak_at.clone(),
        };
        devices.push(held.device(device, b.fits));
    }
    let mut warnings = Vec::new();
    if ranks == 1 && hardware.devices.len() > 1 {
        warnings.push(format!(
            "vLLM serves from one GPU unless --tensor-parallel-size is set (its default is 1): GPU 0 only \
             of the {} in `{}`; use `--parallel tp={}` to shard the model over them",
            hardware.devices.len(),
            hardware.name,
            hardware.devices.len()
        ));
    }
    if pp > 1 {
        warnings.push(
            "the non-torch memory of a pipeline-parallel rank (NCCL's buffers) is taken as a tensor-parallel \
             group's of the same world size: no pipeline-parallel vLLM log was found to measure it"
                .to_string(),
        );
    }
    // A tensor-parallel group across nodes all-reduces every layer over the network.
    let group_nodes = |g: &[vramplan_profiles::hardware::Device]| {
        g.iter().map(|d| d.node).collect::<std::collections::BTreeSet<_>>().len()
    };
    let per_node = hardware.devices.iter().filter(|d| d.node == hardware.devices[0].node).count() as u32;
    if tp > 1 && group_nodes(&hardware.devices[..tp as usize]) > 1 && tp.is_multiple_of(per_node) {
        warnings.push(format!(
            "the tensor-parallel group of {tp} GPUs spans {} nodes, and every layer's all-reduce crosses the \
             network; vLLM advises tensor parallel inside a node and pipeline parallel across nodes: \
             `--parallel tp={per_node},pp={}` (the same GPUs, sized differently)",
            tp / per_node,
            tp / per_node * pp
        ));
    }
    Ok(finish(devices, Some(capacity), warnings))
}

/// SGLang's estimate: the ranks of `--dp-size` replicas of the tensor-parallel group, each with
/// the same budget. The token pool and the request pool are the KV cache; the activations are one
/// chunked-prefill forward's (within the slack the static fraction leaves, which also takes the
/// CUDA graphs); the CUDA context and the distributed environment are the overhead.
pub fn sglang_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
) -> Result<Estimate, InputError> {
    let tp = workload.tensor_parallel_size();
    let dp = match workload.engine {
        crate::workload::Engine::Sglang { dp_size, .. } => dp_size.unwrap_or(1).max(1),
        _ => 1,
    };
    let gpus = tp as usize * dp as usize;
    if gpus > hardware.devices.len() {
        return Err(InputError::new(
            "--parallel",
            format!(
                "SGLang with --tp-size {tp} and --dp-size {dp} runs on {gpus} GPUs, but `{}` has {}",
                hardware.name,
                hardware.devices.len()
            ),
        )
        .with_fix("use a profile with enough GPUs, or a smaller --tp-size / --dp-size"));
    }
    let group = &hardware.devices[..tp as usize];
    let custom_all_reduce = tp == 2 || group.iter().all(|d| d.nvlink.is_some());
    let mut devices = Vec::new();
    let mut warnings = Vec::new();
    let mut capacity = u64::MAX;
    for device in hardware.devices.iter().take(gpus) {
        let b = sglang::budget(model, device, workload, tp, custom_all_reduce)?;
        if b.profiled_tokens == 0 && devices.is_empty() {
            // SGLang's own refusal (`_profile_available_bytes`), with the fraction that would do.
            let minimum = b.weights_bytes as f64 / b.pre_load_bytes.max(1) as f64;
            warnings.push(if minimum < 1.0 {
                format!(
                    "SGLang refuses to start: \"Loaded weights leave no GPU memory for the KV cache under \
                     --mem-fraction-static={}\"; raise it above {:.3}, or shard over more GPUs",
                    b.mem_fraction_static,
                    (minimum * 1000.0).ceil() / 1000.0
                )
            } else {
                format!(
                    "SGLang cannot load the model: its {} per GPU exceed the {} free before loading; shard it \
                     with --parallel tp=N",
                    format_bytes(b.weights_bytes),
                    format_bytes(b.pre_load_bytes)
                )
            });
        }
        capacity = capacity.min(b.max_total_num_tokens);
        let pool = b.max_total_num_tokens.saturating_mul(b.kv_bytes_per_token);
        let held = Held {
            weights: b.weights_bytes,
            activations: b.activation_peak_bytes,
            kv_cache: pool.saturating_add(b.req_to_token_bytes),
            overhead: device.context_reserve_bytes + b.distributed_init_bytes,
            peak_at: b.activation_peak_at.clone(),
        };
        devices.push(held.device(device, b.fits));
    }
    if gpus == 1 && hardware.devices.len() > 1 {
        warnings.push(format!(
            "SGLang serves from one GPU unless --tp-size or --dp-size is set (both default to 1): GPU 0 \
             only of the {} in `{}`; use `--parallel tp={}` to shard the model over them",
            hardware.devices.len(),
            hardware.name,
            hardware.devices.len()
        ));
    }
    Ok(finish(devices, Some(capacity), warnings))
}

/// llama.cpp's estimate: its buffers on every GPU that holds part of the model. `placement` is
/// the map or plan given; the default one (everything on GPU 0, what the CLI passes when none is
/// given) is replaced by llama.cpp's own split.
pub fn llamacpp_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
) -> Result<Estimate, InputError> {
    if hardware.devices.is_empty() {
        return Err(InputError::new(&hardware.name, "the profile has no GPU"));
    }
    let layers = if *placement == Placement::single(0) {
        LayerPlacement::default_split(model, hardware)
    } else {
        LayerPlacement::from_placement(model, placement)
    };
    let budget = llamacpp_split::split_budget(model, hardware, workload, &layers)?;
    let mut devices = Vec::new();
    for buffers in &budget.devices {
        let Some(device) = hardware.devices.iter().find(|d| d.index == buffers.gpu) else { continue };
        let allocated = buffers.gpu_bytes();
        let held = Held {
            weights: buffers.model_bytes,
            activations: buffers.compute_bytes,
            kv_cache: buffers.kv_bytes,
            overhead: device.context_reserve_bytes,
            peak_at: buffers.compute_peak_at.clone(),
        };
        devices.push(held.device(device, allocated <= device.usable_bytes()));
    }
    let mut warnings = Vec::new();
    let on_host = layers.layers.iter().filter(|l| l.is_none()).count();
    if on_host > 0 {
        warnings.push(format!(
            "{on_host} of {} layers stay on the host and run on the CPU; host memory holds {} of \
             weights and {} of KV cache for them",
            layers.layers.len(),
            format_bytes(budget.host_model_bytes),
            format_bytes(budget.host_kv_bytes)
        ));
    }
    Ok(finish(devices, None, warnings))
}

fn finish(devices: Vec<DeviceEstimate>, kv_capacity_tokens: Option<u64>, warnings: Vec<String>) -> Estimate {
    let peak_bytes = devices.iter().map(|d| d.device_used_bytes).max().unwrap_or(0);
    let fits = !devices.is_empty() && devices.iter().all(|d| d.fits);
    Estimate { devices, peak_bytes, fits, kv_capacity_tokens, warnings }
}

/// What an engine holds on one GPU: its own buffers (allocated once, so allocated and reserved
/// are the same), and what it holds outside them.
struct Held {
    weights: u64,
    activations: u64,
    kv_cache: u64,
    /// Outside the engine's buffers: the CUDA context and whatever else the engine adds.
    overhead: u64,
    peak_at: String,
}

impl Held {
    fn device(self, device: &vramplan_profiles::hardware::Device, fits: bool) -> DeviceEstimate {
        let allocated = self.weights.saturating_add(self.activations).saturating_add(self.kv_cache);
        DeviceEstimate {
            id: device.index,
            name: device.name.clone(),
            capacity_bytes: device.memory_bytes,
            usable_bytes: device.usable_bytes(),
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: allocated,
            device_used_bytes: allocated + self.overhead,
            peak_at: self.peak_at,
            steady_bytes: self.weights + self.kv_cache,
            loaded_bytes: self.weights,
            components: Components {
                weights: self.weights,
                activations: self.activations,
                kv_cache: self.kv_cache,
                overhead: self.overhead,
                ..Components::default()
            },
            fits,
        }
    }
}
