//! The memory simulator: the workload spec, the PyTorch-on-CUDA memory model per placement unit
//! and component, placements, and the per-device step timeline with its peak. It reads models
//! and hardware from `vramplan-profiles` and knows nothing about solving.

pub mod allocator;
pub mod charges;
mod closed_form;
pub mod device_map;
pub mod engines;
pub mod estimate;
mod fsdp;
pub mod input;
mod model;
pub mod placement;
pub mod program;
mod sweep;
pub mod tensor_parallel;
mod timeline;
pub mod trace;
pub mod workload;

pub use closed_form::{ModelStates, model_states, saved_activation_bytes};
pub use estimate::{Estimate, estimate};
pub use placement::{Placement, Target};
pub use sweep::Sweep;
pub use workload::Workload;
