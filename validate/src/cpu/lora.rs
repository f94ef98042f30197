//! LoRA in the `cpu` backend, as PEFT applies it to a model accelerate has dispatched
//! (`get_peft_model` after `from_pretrained(device_map=...)`, PEFT 0.21):
//!
//! - each adapted `nn.Linear` is replaced by a wrapper (`lora.Linear`) holding the original as
//!   `base_layer`: accelerate's hook stays on the original, so the wrapper's own input is not
//!   moved; the wrapper runs `base_layer(x)`, then `lora_B(lora_A(x))` on its unmoved input, and
//!   adds the two (`peft/tuners/lora/layer.py`, `Linear.forward`);
//! - the adapters are made on the CPU and moved to the device of the base layer's weight
//!   (`_move_adapter_to_device_of_base_layer`): where accelerate's offload left that weight on
//!   the meta device, the adapters are moved there too, and the first forward meets them there
//!   ("Expected all tensors to be on the same device, … cuda:0 and meta!"; with real weights
//!   users also see "Cannot copy out of meta tensor; no data!");
//! - only the adapters are trained (`requires_grad` is turned off everywhere else).

use super::dispatch::{Device, Dispatched, Home};
use super::{Placed, Run, Stop, WIDTH};
use candle_core::{Device as Host, Var};
use std::collections::BTreeMap;
use vramplan_profiles::model::{Module, join};

/// One linear module's adapters: the paths of their weights (keys of the run's weights) and
/// the device PEFT put them on.
#[derive(Debug, Clone)]
pub(super) struct Adapter {
    a: String,
    b: String,
    device: Device,
}

/// The adapters of `targets`, whose weights are added to `weights` as the only trainable ones.
pub(super) fn adapt(
    targets: &[String],
    dispatched: &Dispatched,
    weights: &mut BTreeMap<String, Var>,
    trainable: &mut BTreeMap<String, bool>,
) -> candle_core::Result<BTreeMap<String, Adapter>> {
    trainable.values_mut().for_each(|t| *t = false);
    let mut adapters = BTreeMap::new();
    for target in targets {
        let weight = join(target, "weight");
        let device = match dispatched.storage.get(&weight).map(|s| dispatched.homes[s]) {
            Some(Home::On(d)) => d,
            Some(Home::Streamed) => Device::Meta,
            // A linear with no weight of its own: PEFT finds no device and leaves the adapters
            // on the CPU.
            None => Device::Cpu,
        };
        let a = format!("{target}.lora_A.default.weight");
        let b = format!("{target}.lora_B.default.weight");
        for (k, path) in [&a, &b].into_iter().enumerate() {
            let values: Vec<f32> = (0..WIDTH).map(|i| 0.05 + (k + i) as f32 * 0.01).collect();
            weights.insert(path.clone(), Var::from_vec(values, WIDTH, &Host::Cpu)?);
            trainable.insert(path.clone(), true);
        }
        adapters.insert(target.clone(), Adapter { a, b, device });
    }
    Ok(adapters)
}

impl Run<'_> {
    /// PEFT's wrapper around `m`: the original as `base_layer` behind its hook, the adapters on
    /// the wrapper's unmoved input, and their sum.
    pub(super) fn adapted(
        &mut self,
        m: &Module,
        adapter: &Adapter,
        input: Placed,
        side: &[Placed],
    ) -> Result<Placed, Stop> {
        self.running.push(m.path.clone());
        let base = self.hooked(m, join(&m.path, "base_layer"), input.clone(), side)?;
        let mut x = input;
        for (name, weight) in [("lora_A", &adapter.a), ("lora_B", &adapter.b)] {
            let placed = Placed { tensor: self.weights[weight].as_tensor().clone(), device: adapter.device };
            self.running.push(format!("{}.{name}.default", m.path));
            x = self.operation("linear", &x, &[], &[placed])?;
            self.running.pop();
        }
        let out = self.operation("add", &base, &[x], &[])?;
        self.running.pop();
        Ok(out)
    }
}
