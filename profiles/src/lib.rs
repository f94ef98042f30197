//! Hardware profiles, model descriptions and byte units: the inputs every other vramplan crate
//! works from.
//!
//! - [`hardware`]: GPU profiles (a YAML schema and a built-in catalog), parsed from a name, a
//!   short form such as `2xt4`, or a file.
//! - [`model`]: one description of a model — a module tree with PyTorch/transformers names, every
//!   tensor's shape and dtype, tied groups and the architectural facts — built from a HF
//!   `config.json`, safetensors headers, a custom YAML file or the built-in catalog.
//! - [`units`], [`dtype`] and [`ggml`]: bytes (`u64` end to end, parsed with explicit units),
//!   element types, and the block types of GGUF files.
//! - [`files`]: the one reader of input files (a regular file, within a bound per kind).
//! - [`InputError`]: the one error type for bad input: where, what was expected, and the fix;
//!   [`suggest`]: the "did you mean" every crate's messages use.
//!
//! Nothing here knows about workloads or placement; that is `vramplan-sim` and `vramplan-solver`.

pub mod dtype;
mod error;
pub mod files;
pub mod ggml;
pub mod hardware;
pub mod json_keys;
pub mod model;
pub mod suggest;
pub mod units;

pub use dtype::DType;
pub use error::{InputError, Location};
pub use ggml::GgmlType;
