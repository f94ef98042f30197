//! The rule a *training* map meets under accelerate when it puts modules on `cpu` or `disk`.
//! Offloading is an inference mechanism: accelerate streams the weights in for each forward and
//! throws the copies away after it, which a training step cannot live with. What the runtime
//! does with such a map, from its source:
//!
//! - `dispatch_model` (accelerate/big_modeling.py), which `from_pretrained` calls with the map
//!   (transformers' `accelerate_dispatch`): with more than one device in the map, the modules on
//!   `cpu` or `disk` run on the main device, the first GPU of the map; their state dict is kept
//!   on the CPU (`extract_submodules_state_dict`) or on disk, as the hooks' `weights_map`, and
//!   `attach_align_device_hook_on_blocks` hooks every listed *module* (it walks module names, so
//!   a listed tensor of a parent, such as XLNet's `transformer.mask_emb`, gets no hook);
//! - `AlignDevicesHook.init_hook` (accelerate/hooks.py) puts the offloaded parameters on the
//!   meta device, and moves the module's buffers to the execution device unless
//!   `offload_buffers=True` (the default of `dispatch_model` and `from_pretrained` is `False`);
//!   with it, persistent buffers are reloaded from the CPU copy at every forward;
//! - `pre_forward` makes each parameter anew on the GPU from the `weights_map` value
//!   (`set_module_tensor_to_device(..., value=...)` in accelerate/utils/modeling.py builds a new
//!   `param_cls(new_value, requires_grad=old_value.requires_grad)`: a new leaf tensor), and
//!   `post_forward` swaps it for a meta tensor again;
//! - in training, backward accumulates each gradient into the leaf it was made for, that
//!   forward's copy (autograd's `AccumulateGrad` holds its leaf until the backward has run, so
//!   the copies stay on the GPU from forward to backward, with their gradients), and then the
//!   copies are dropped: the weights in `weights_map` are never updated, and the optimizer, made
//!   over the module's meta parameters, has no gradient to step them with;
//! - `dispatch_model` wraps `model.to` to raise "You can't move a model that has some modules
//!   offloaded to cpu or disk." while any parameter is on meta, and transformers'
//!   `Trainer.__init__` calls `model.to(args.device)` (`_move_model_to_device`) unless the map
//!   spreads the model over GPUs (`is_model_parallel`: its GPUs other than `cpu`/`disk` are
//!   several, or one that is not the trainer's device, `cuda:0` in a one-process run);
//! - a listed tensor that got no hook stays where `from_pretrained` loaded it, the CPU, and the
//!   parent's forward meets it with hidden states on the GPU: PyTorch's device error.

use super::{
    DEVICE_ERROR, Finding, Rule, cuda, join, json_device, label, listed_with_more, overridden_entries, shown,
};
use crate::runtime::Runtime;
use vramplan_profiles::model::{ModelDescription, TensorKind};
use vramplan_profiles::units::format_bytes;
use vramplan_sim::input::lora_target_modules;
use vramplan_sim::placement::covers;
use vramplan_sim::placement::{Placement, Target};
use vramplan_sim::workload::{Finetune, Mode, Workload};

/// accelerate's guard on `model.to` once weights are offloaded (`dispatch_model`).
const MOVE_ERROR: &str =
    "RuntimeError: You can't move a model that has some modules offloaded to cpu or disk.";

/// The finding of a training map (`workload` in train mode) that offloads modules to `cpu` or
/// `disk` under accelerate, if any. `entries` are the map's, in file order (the last device of a
/// name listed twice wins, as `json.load` reads it).
pub fn offloaded_in_training(
    model: &ModelDescription,
    entries: &[(String, Target)],
    runtime: Runtime,
    workload: &Workload,
) -> Option<Finding> {
    if workload.mode != Mode::Train || !matches!(runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
        return None;
    }
    let read = Placement::as_read(entries);
    let map = read.entries();
    // The map's GPUs in the order it lists them; the first is the main device, as the rest of
    // the check and the simulation take `dispatch_model`'s `main_device` (`Placement::main_gpu`).
    let mut gpus: Vec<u32> = Vec::new();
    for (_, t) in map {
        if let Target::Gpu(g) = t
            && !gpus.contains(g)
        {
            gpus.push(*g);
        }
    }
    // `dispatch_model`: with no GPU in the map the CPU is the main device and only `disk`
    // entries are offloaded.
    let main = gpus.first().map_or(Target::Cpu, |g| Target::Gpu(*g));
    // A tensor's own entry inside a listed module places nothing: the module's hook moves it.
    let overridden = overridden_entries(model, map);
    let offloaded: Vec<&(String, Target)> = map
        .iter()
        .zip(&overridden)
        .filter(|((_, t), overridden)| match t {
            _ if **overridden => false,
            Target::Gpu(_) => false,
            Target::Cpu => main != Target::Cpu,
            Target::Disk => true,
        })
        .map(|(entry, _)| entry)
        // An entry holding no parameter of its own (buffers only, which the hook leaves on the
        // GPU; or tied weights, whose storage the group keeps elsewhere) offloads nothing that
        // trains: recorded, the Llama rotary embedding or a tied head on `cpu` train.
        .filter(|(key, _)| own_parameter_bytes(model, key) > 0)
        .collect();
    if offloaded.is_empty() {
        return None;
    }
    // Listed modules get accelerate's hooks; listed tensors of a parent do not.
    let is_module = |(k, _): &&&(String, Target)| model.root.find(k).is_some();
    let modules: Vec<&(String, Target)> = offloaded.iter().filter(is_module).copied().collect();
    let tensors: Vec<&(String, Target)> = offloaded.iter().filter(|e| !is_module(e)).copied().collect();
    if matches!(workload.finetune, Finetune::Lora { .. }) {
        // Targets that match nothing were refused by the input checks.
        let targets = lora_target_modules(workload, model).unwrap_or_default();
        return lora_offload(model, &modules, &tensors, main, &gpus, &targets);
    }
    let mut parts = Vec::new();
    parts.push(format!(
        "This training map offloads {}. Offloading streams weights for inference; training needs them \
         in place.",
        listed_with_more(&entry_labels(&offloaded))
    ));
    if !modules.is_empty() {
        parts.push(modules_part(model, &modules, main, &gpus));
    }
    if !tensors.is_empty() {
        parts.push(tensors_part(model, &tensors, main));
    }
    parts.push(format!(
        "Fix: put them on a GPU, e.g. {} (`vramplan plan … --mode train` places a training step); to \
         train with weights off the GPU, leave the map out and offload with DeepSpeed ZeRO-3 \
         (`--parallel zero3 --offload-params`), which updates the CPU copy.",
        listed_with_more(&moved_to(&offloaded, main))
    ));
    Some(finding(&offloaded, main, parts))
}

/// Bytes of the parameters under `key` (a module or a tensor), tied ones left out.
fn own_parameter_bytes(model: &ModelDescription, key: &str) -> u64 {
    let mut bytes = 0;
    model.root.visit(&mut |m| {
        for t in &m.tensors {
            if t.kind == TensorKind::Parameter && t.tied_to.is_none() && covers(key, &join(&m.path, &t.name))
            {
                bytes += t.bytes();
            }
        }
    });
    bytes
}

/// The finding of a LoRA training map that offloads `modules` and `tensors`: only the adapted
/// modules, the listed tensors, and (where the map's only GPU is the trainer's) the HF Trainer's
/// refusal break the step; frozen weights may be streamed (fixtures/reference/mismatches:
/// `llama-lora-embedding-on-cpu` completes, `llama-lora-layer-on-cpu` stops in an adapter).
fn lora_offload(
    model: &ModelDescription,
    modules: &[&(String, Target)],
    tensors: &[&(String, Target)],
    main: Target,
    gpus: &[u32],
    targets: &[String],
) -> Option<Finding> {
    let adapts = |key: &str| targets.iter().any(|t| covers(key, t));
    let adapted: Vec<&(String, Target)> = modules.iter().filter(|(k, _)| adapts(k)).copied().collect();
    let frozen: Vec<&(String, Target)> = modules.iter().filter(|(k, _)| !adapts(k)).copied().collect();
    let trainer_refuses = trainer_moves_model(gpus) && !modules.is_empty();
    if adapted.is_empty() && tensors.is_empty() && !trainer_refuses {
        return None;
    }
    let gpu = label(main);
    let all: Vec<&(String, Target)> = modules.iter().chain(tensors).copied().collect();
    let mut parts =
        vec![format!("This LoRA training map offloads {}.", listed_with_more(&entry_labels(&all)))];
    if !adapted.is_empty() {
        let wrapped: Vec<&String> =
            targets.iter().filter(|t| adapted.iter().any(|(k, _)| covers(k, t))).collect();
        parts.push(format!(
            "PEFT moves each new adapter to the device of its base layer's weight \
             (`_move_adapter_to_device_of_base_layer`), and accelerate's offload has left the weights of {} on \
             the meta device, so the adapters of {} linear layer{} there (`{}` first) are made on meta, and the \
             first forward raises `{DEVICE_ERROR}, {} and meta!` in `{}.lora_A.default`.",
            listed_with_more(&adapted.iter().map(|(k, _)| shown(k)).collect::<Vec<_>>()),
            wrapped.len(),
            if wrapped.len() == 1 { "" } else { "s" },
            wrapped.first().map_or("", |t| t.as_str()),
            cuda(main),
            wrapped.first().map_or("", |t| t.as_str()),
        ));
    }
    if !tensors.is_empty() {
        parts.push(tensors_part(model, tensors, main));
    }
    if trainer_refuses {
        parts.push(format!(
            "With {gpu} the map's only GPU, the HF Trainer moves the model to its device \
             (`Trainer._move_model_to_device`) and accelerate refuses: `{MOVE_ERROR}`"
        ));
    } else if !frozen.is_empty() {
        parts.push(format!(
            "{} hold{} no adapter: {} frozen weights are streamed in for each forward, which a LoRA step can \
             live with.",
            listed_with_more(&frozen.iter().map(|(k, _)| shown(k)).collect::<Vec<_>>()),
            if frozen.len() == 1 { "s" } else { "" },
            if frozen.len() == 1 { "its" } else { "their" },
        ));
    }
    let broken: Vec<&(String, Target)> =
        if trainer_refuses { all.clone() } else { adapted.iter().chain(tensors).copied().collect() };
    parts.push(format!(
        "Fix: put {} on a GPU, e.g. {}{}.",
        if broken.len() == 1 { "it" } else { "them" },
        listed_with_more(&moved_to(&broken, main)),
        if trainer_refuses { "" } else { "; modules with no adapter may stay offloaded" },
    ));
    Some(finding(&broken, main, parts))
}

/// The HF Trainer moves the model to its device (`Trainer._move_model_to_device`) when the
/// map's GPUs are only the trainer's own, `cuda:0` in a one-process run (`is_model_parallel`
/// is false).
fn trainer_moves_model(gpus: &[u32]) -> bool {
    gpus == [0]
}

/// `name (device)` for each entry.
fn entry_labels(entries: &[&(String, Target)]) -> Vec<String> {
    entries.iter().map(|(k, t)| format!("{} ({})", shown(k), label(*t))).collect()
}

/// The fix's example for each entry: `"name": main`.
fn moved_to(entries: &[&(String, Target)], main: Target) -> Vec<String> {
    entries.iter().map(|(k, _)| format!("`\"{k}\": {}`", json_device(main))).collect()
}

/// The finding about `entries`: the main device first, then each other device they name once.
fn finding(entries: &[&(String, Target)], main: Target, parts: Vec<String>) -> Finding {
    let mut devices = vec![label(main)];
    for (_, t) in entries {
        if !devices.contains(&label(*t)) {
            devices.push(label(*t));
        }
    }
    Finding {
        rule: Rule::OffloadedInTraining,
        modules: entries.iter().map(|(k, _)| k.clone()).collect(),
        devices,
        message: parts.join(" "),
    }
}

/// What happens to listed modules: hooked, streamed in, never trained; the trainer's refusal
/// when the map holds one GPU, the trainer's own; their buffers.
fn modules_part(
    model: &ModelDescription,
    modules: &[&(String, Target)],
    main: Target,
    gpus: &[u32],
) -> String {
    let mut params = 0u64;
    let mut buffers: Vec<String> = Vec::new();
    for (key, _) in modules {
        let Some(module) = model.root.find(key) else { continue };
        module.visit(&mut |m| {
            for t in m.tensors.iter().filter(|t| t.tied_to.is_none()) {
                match t.kind {
                    TensorKind::Buffer { .. } => buffers.push(join(&m.path, &t.name)),
                    TensorKind::Parameter => params += t.bytes(),
                    _ => {}
                }
            }
        });
    }
    let gpu = label(main);
    let mut text = format!(
        "accelerate's `dispatch_model` keeps the listed modules' weights ({}) on the CPU or disk, makes \
         them anew on {gpu} for each forward (`AlignDevicesHook.pre_forward`) and swaps them for meta \
         tensors after it (`post_forward`).",
        format_bytes(params)
    );
    if trainer_moves_model(gpus) {
        text += &format!(
            " With {gpu} the map's only GPU, the HF Trainer moves the model to its device \
             (`Trainer._move_model_to_device`) and accelerate refuses: `{MOVE_ERROR}`"
        );
        text += " Where the step does run (a map over several GPUs, or a loop that never calls `.to`),";
    } else {
        text += " The step runs, but";
    }
    text += &format!(
        " backward leaves each gradient on that forward's copy, which is then dropped: the offloaded weights \
         are never updated (the optimizer holds their meta tensors), and the copies with their gradients \
         stay on {gpu} from forward to backward all the same, which the memory figures here leave out."
    );
    if !buffers.is_empty() {
        text += &format!(
            " Their buffers ({}) move to {gpu} at dispatch and stay (`offload_buffers=False`, the default); \
             with `offload_buffers=True` they are reloaded from the CPU copy at every forward and their \
             in-place updates (a running state) are lost each step.",
            listed_with_more(&buffers.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>())
        );
    }
    text
}

/// What happens to listed tensors of parent modules: no hook, left on the CPU; one sentence per
/// parent.
fn tensors_part(model: &ModelDescription, tensors: &[&(String, Target)], main: Target) -> String {
    let mut parents: Vec<(&str, Vec<String>)> = Vec::new();
    for (key, _) in tensors {
        let parent = key.rsplit_once('.').map_or("", |(m, _)| m);
        match parents.iter_mut().find(|(p, _)| *p == parent) {
            Some((_, names)) => names.push(format!("`{key}`")),
            None => parents.push((parent, vec![format!("`{key}`")])),
        }
    }
    let gpu = if main == Target::Cpu { Target::Gpu(0) } else { main };
    let sentences: Vec<String> = parents
        .iter()
        .map(|(parent, names)| {
            let one = names.len() == 1;
            let class = model.root.find(parent).map(|m| format!(" ({})", m.class)).unwrap_or_default();
            format!(
                "{} {} of `{parent}`{class}, not {}: accelerate hooks listed modules only, so {} on the CPU \
                 where `from_pretrained` loaded {}, and wherever `{parent}`'s forward uses {} with hidden states \
                 on {} it raises `{DEVICE_ERROR}, {} and cpu!`",
                listed_with_more(names),
                if one { "is a tensor" } else { "are tensors" },
                if one { "a module" } else { "modules" },
                if one { "it stays" } else { "they stay" },
                if one { "it" } else { "them" },
                if one { "it" } else { "them" },
                label(gpu),
                cuda(gpu),
            )
        })
        .collect();
    sentences.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramplan_profiles::model::{self, ImportOptions};

    fn train() -> Workload {
        Workload { mode: Mode::Train, ..Workload::default() }
    }

    fn map(entries: &[(&str, Target)]) -> Vec<(String, Target)> {
        entries.iter().map(|(k, t)| (k.to_string(), *t)).collect()
    }

    #[test]
    fn only_offloaded_entries_of_a_training_map_under_accelerate_are_found() {
        let model = model::load("gpt2", ImportOptions::default()).unwrap();
        let split = map(&[
            ("transformer.wte", Target::Cpu),
            ("transformer.wpe", Target::Gpu(0)),
            ("transformer.h", Target::Gpu(0)),
            ("transformer.ln_f", Target::Gpu(0)),
            ("lm_head", Target::Cpu),
        ]);
        let found = offloaded_in_training(&model, &split, Runtime::Accelerate, &train()).unwrap();
        assert_eq!(found.rule, Rule::OffloadedInTraining);
        // The head holds only the tied weight, whose storage is the embedding's: nothing of its
        // own is offloaded (recorded: a tied head on `cpu` trains).
        assert_eq!(found.modules, ["transformer.wte"]);
        assert_eq!(found.devices, ["GPU 0", "cpu"]);
        assert!(found.message.contains(MOVE_ERROR), "{}", found.message);
        // Inference is what offloading is for; other runtimes read no accelerate hooks.
        let inference = Workload::default();
        assert_eq!(offloaded_in_training(&model, &split, Runtime::Accelerate, &inference), None);
        assert_eq!(offloaded_in_training(&model, &split, Runtime::Pipeline, &train()), None);
        // With no GPU in the map the CPU is the main device: only `disk` is offloaded.
        let on_cpu = map(&[("", Target::Cpu)]);
        assert_eq!(offloaded_in_training(&model, &on_cpu, Runtime::Accelerate, &train()), None);
        let cpu_and_disk =
            map(&[("transformer", Target::Cpu), ("transformer.h", Target::Disk), ("lm_head", Target::Cpu)]);
        let found = offloaded_in_training(&model, &cpu_and_disk, Runtime::AccelerateV4, &train()).unwrap();
        assert_eq!(found.modules, ["transformer.h"]);
        // A name listed twice keeps its last device.
        let moved = map(&[("", Target::Cpu), ("", Target::Gpu(1))]);
        assert_eq!(offloaded_in_training(&model, &moved, Runtime::Accelerate, &train()), None);
    }

    /// LoRA trains only the adapters: a frozen module may be streamed (over several GPUs, where
    /// the HF Trainer leaves the model where it is); an adapted one may not (PEFT puts its
    /// adapters on the meta device); on one GPU the Trainer's `model.to` is refused either way.
    #[test]
    fn a_lora_map_may_offload_only_frozen_modules_and_only_over_several_gpus() {
        let model = model::load("gpt2", ImportOptions::default()).unwrap();
        let lora = Workload {
            finetune: Finetune::Lora { rank: 8, alpha: 16, targets: vec!["c_attn".into()] },
            ..train()
        };
        let frozen_two = map(&[
            ("transformer.wte", Target::Cpu),
            ("transformer.wpe", Target::Gpu(0)),
            ("transformer.h", Target::Gpu(0)),
            ("transformer.ln_f", Target::Gpu(1)),
            ("lm_head", Target::Gpu(1)),
        ]);
        assert_eq!(offloaded_in_training(&model, &frozen_two, Runtime::Accelerate, &lora), None);
        // A full fine-tune of the same map trains a streamed copy.
        assert!(offloaded_in_training(&model, &frozen_two, Runtime::Accelerate, &train()).is_some());
        let adapted = map(&[
            ("transformer.wte", Target::Gpu(0)),
            ("transformer.wpe", Target::Gpu(0)),
            ("transformer.h.0", Target::Gpu(0)),
            ("transformer.h.1", Target::Cpu),
            ("transformer.h", Target::Gpu(1)),
            ("transformer.ln_f", Target::Gpu(1)),
            ("lm_head", Target::Gpu(1)),
        ]);
        let found = offloaded_in_training(&model, &adapted, Runtime::Accelerate, &lora).unwrap();
        assert_eq!(found.modules, ["transformer.h.1"]);
        assert!(found.message.contains("cuda:0 and meta!"), "{}", found.message);
        assert!(found.message.contains("`transformer.h.1.attn.c_attn.lora_A.default`"), "{}", found.message);
        let frozen_one = map(&[("transformer.wte", Target::Cpu), ("", Target::Gpu(0))]);
        let found = offloaded_in_training(&model, &frozen_one, Runtime::Accelerate, &lora).unwrap();
        assert!(found.message.contains(MOVE_ERROR), "{}", found.message);
    }
}
