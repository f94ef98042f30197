//! Estimates of one configuration at many shapes. A what-if grid or boundary search probes one
//! model, hardware, workload and placement at many batch sizes and sequence lengths; what the
//! step program takes from the model that does not depend on them (LoRA targets, dtypes, units
//! and their tensors, the activation model's traits, where each unit runs) is resolved once, and
//! each shape writes and replays only its own operations. The figures are those of
//! [`estimate_within`] at that shape, which the tests hold it to.

use crate::estimate::{Estimate, estimate_within, gpu_limits, is_data_parallel, replayed_estimate};
use crate::placement::Placement;
use crate::program::{Op, Resolved};
use crate::timeline::ReplayState;
use crate::workload::{Engine, Workload};
use std::sync::OnceLock;
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
    /// The load's operations, the same at every shape, and the replay after them: each shape
    /// replays only its step, from a copy of this.
    loaded: OnceLock<(Vec<Op>, ReplayState)>,
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
        Sweep { model, hardware, base: workload, placement, headroom, resolved, loaded: OnceLock::new() }
    }

    /// The estimate of `workload`: from what is resolved where it is the sweep's workload at
    /// another shape ([`Workload::same_but_shape`]), else a whole [`estimate_within`].
    pub fn estimate(&self, workload: &Workload) -> Result<Estimate, InputError> {
        match &self.resolved {
            Some(resolved) if self.base.same_but_shape(workload) => {
                let program = resolved.program(self.hardware, workload);
                let limits = gpu_limits(self.hardware, self.headroom);
                let (load, step) = program.ops.split_at(program.load_ops);
                let (loaded_ops, loaded) = self.loaded.get_or_init(|| {
                    let mut state = ReplayState::new(&program, &limits);
                    state.run(load, &limits);
                    (load.to_vec(), state)
                });
                // The load reads no shape (`StepProgram::load_ops`); the tests hold it to that.
                debug_assert!(loaded_ops.as_slice() == load, "the load differs between shapes");
                let mut state = loaded.clone();
                state.run(step, &limits);
                replayed_estimate(self.hardware, state.finish(&program).devices)
            }
            _ => estimate_within(self.model, self.hardware, workload, &self.placement, self.headroom),
        }
    }
}
