//! The device-map solver (to come): placement units per target runtime, the exact ILP (good_lp
//! with HiGHS), infeasibility diagnosis, accelerate's greedy algorithm as a baseline, and
//! exports to runtime formats (accelerate JSON, llama.cpp flags, expert-parallel, pipeline).
