//! The memory simulator: the workload spec, the PyTorch-on-CUDA memory model per placement unit
//! and component, placements, and the per-device step timeline with its peak. It reads models
//! and hardware from `vramplan-profiles` and knows nothing about solving.

mod allocator;
mod closed_form;
pub mod estimate;
mod model;
pub mod placement;
mod timeline;
pub mod workload;

pub use closed_form::{ModelStates, model_states, saved_activation_bytes};
pub use estimate::{Estimate, estimate};
pub use placement::{Placement, Target};
pub use workload::Workload;
