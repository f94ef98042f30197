//! The memory simulator (to come): the workload spec, the PyTorch-on-CUDA memory model per
//! placement unit and component, placements, and the per-device step timeline with its peak.
//! It reads models and hardware from `vramplan-profiles` and knows nothing about solving.
