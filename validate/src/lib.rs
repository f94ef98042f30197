//! The plan validator (to come): runs a plan on real CUDA devices (cudarc, loaded at run time),
//! on the CPU with candle-core at reduced scale, or statically checks it for the device
//! mismatches the target runtime would hit.
