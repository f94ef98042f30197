//! The device-map solver: placement units per target runtime, the exact ILP (good_lp with
//! HiGHS), infeasibility diagnosis with verified remedies, accelerate's greedy algorithm as a
//! baseline, the static mismatch check of a device map, and exports to runtime formats
//! (accelerate JSON, llama.cpp flags, expert-parallel, pipeline, vramplan's YAML plan).

pub mod build;
mod chain;
pub mod check;
pub mod explain;
pub mod export;
pub mod greedy;
pub mod ilp;
pub mod plan;
pub mod problem;
mod rank_plan;
pub mod runtime;
pub mod whatif;

pub use problem::{Assignment, Device, Problem, Steady, Unit};
pub use runtime::Runtime;
/// Where a unit goes: a GPU, the CPU or disk (the simulator's placement target).
pub use vramplan_sim::placement::Target;
