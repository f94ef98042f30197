//! Estimates of one configuration at many shapes. A what-if grid or boundary search probes one
//! model, hardware, workload and placement at many batch sizes and sequence lengths; what the
//! step program takes from the model that does not depend on them (LoRA targets, dtypes, units
//! and their tensors, the activation model's traits, where each unit runs) is resolved once, and
//! each shape writes and replays only its own operations. The figures are those of
//! [`estimate_within`] at that shape, which the tests hold it to.

use crate::estimate::{Estimate, estimate_within, gpu_limits, is_data_parallel, replayed_estimate};
use crate::placement::Placement;
use crate::program::Resolved;
use crate::timeline::ReplayState;
use crate::workload::{Engine, Workload};
use std::sync::{Mutex, OnceLock, PoisonError};
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

/// One configuration, ready to be estimated at any shape.
pub struct Sweep<'a> {
    model: &'a ModelDescription,
    hardware: &'a HardwareProfile,
    base: &'a Workload,
    placement: Placement,
    headroom: f64,
    /// `None` where the estimate takes another path than one replayed program (vLLM,
    /// llama.cpp, data parallelism): every shape is then a whole estimate.
    resolved: Option<Resolved<'a>>,
    /// The replay after the load, the same at every shape: each shape replays only its step,
    /// from a copy of this.
    loaded: OnceLock<ReplayState>,
    /// States whose shape is done, for the next shapes to copy the load into: a copy into one
    /// reuses its tables rather than allocate them again.
    spare: Mutex<Vec<ReplayState>>,
}

impl<'a> Sweep<'a> {
    /// Resolves `workload` for `model` placed on `hardware` by `placement`, judged under
    /// `headroom` as [`estimate_within`] judges it.
    pub fn new(
        model: &'a ModelDescription,
        hardware: &'a HardwareProfile,
        workload: &'a Workload,
        placement: Placement,
        headroom: f64,
    ) -> Sweep<'a> {
        let one_program = matches!(workload.engine, Engine::Transformers) && !is_data_parallel(workload);
        let resolved = one_program.then(|| Resolved::new(model, hardware, workload, &placement));
        Sweep {
            model,
            hardware,
            base: workload,
            placement,
            headroom,
            resolved,
            loaded: OnceLock::new(),
            spare: Mutex::default(),
        }
    }

    /// The estimate of `workload`: from what is resolved where it is the sweep's workload at
    /// another shape ([`Workload::same_but_shape`]), else a whole [`estimate_within`].
    pub fn estimate(&self, workload: &Workload) -> Result<Estimate, InputError> {
        match &self.resolved {
            Some(resolved) if self.base.same_but_shape(workload) => {
                let limits = gpu_limits(self.hardware, self.headroom);
                let loaded = self.loaded.get_or_init(|| {
                    let program = resolved.program(workload);
                    let mut state = ReplayState::new(&program, &limits);
                    state.run(&program.ops[..program.load_ops], &limits);
                    state
                });
                let step = resolved.step(workload);
                let spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let mut state = match spare {
                    Some(mut state) => {
                        state.clone_from(loaded);
                        state
                    }
                    None => loaded.clone(),
                };
                state.run(&step.ops, &limits);
                let devices = state.devices(|event| resolved.describe(event), &step.managed_bytes);
                self.spare.lock().unwrap_or_else(PoisonError::into_inner).push(state);
                replayed_estimate(self.hardware, devices)
            }
            _ => estimate_within(self.model, self.hardware, workload, &self.placement, self.headroom),
        }
    }
}
