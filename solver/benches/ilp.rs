//! Criterion benches of the placement ILP on the three instances the issue names: DeepSeek-V3
//! expert-parallel over 32 H100s, Llama-2-70B in pipeline order over four A100-40GB, and
//! Mixtral-8x7B (4-bit) in order over two T4s. Sizes come from the models' shapes; everything
//! that is not placed (replicated attention, library workspaces) sits in the devices' fixed
//! bytes.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use vramplan_solver::ilp::{self, SolveOptions};
use vramplan_solver::{Device, Problem, Target, Unit};

fn unit(name: String, resident_bytes: u64) -> Unit {
    Unit::weights(name, resident_bytes)
}

fn gpus(n: u32, capacity_bytes: u64, fixed_bytes: u64, per_node: u32, links: (u64, u64)) -> Vec<Device> {
    (0..n)
        .map(|i| {
            // The last GPU of a node reaches the next node over the network.
            let last_of_node = i % per_node == per_node - 1;
            Device {
                name: format!("GPU {i}"),
                tier: Target::Gpu(i),
                capacity_bytes,
                fixed_bytes,
                class: u32::from(last_of_node),
                link_bytes_per_s: if last_of_node { links.1 } else { links.0 },
            }
        })
        .collect()
}

/// DeepSeek-V3 (fp8) expert-parallel on 4 nodes × 8 H100-80GB: 58 MoE layers of 256 routed
/// experts (3 × 7168 × 2048 bytes each), 3 dense MLPs (3 × 7168 × 18432 bytes); attention,
/// shared experts, embeddings and KV cache replicated on every GPU (20 GB fixed).
fn deepseek_v3_ep32() -> Problem {
    let usable = (81_559u64 - 600) << 20;
    let limit = usable / 10 * 9;
    let fixed = 20_000_000_000;
    let mut units = Vec::new();
    for layer in 0..3 {
        let mut dense = unit(format!("model.layers.{layer}.mlp"), 3 * 7168 * 18432);
        dense.transient_bytes = 64 << 20;
        units.push(dense);
    }
    for layer in 3..61 {
        let mut experts = unit(format!("model.layers.{layer}.mlp.experts[0..256]"), 3 * 7168 * 2048);
        experts.count = 256;
        experts.transient_bytes = 8 << 20;
        units.push(experts);
    }
    Problem {
        units,
        devices: gpus(32, limit - fixed, fixed, 8, (450_000_000_000, 50_000_000_000)),
        together: vec![],
        pins: vec![],
        ordered: false,
        min_devices: false,
        offload_runs_on: None,
    }
}

/// A decoder in pipeline order: embedding, `layers` identical layers, final norm, head.
#[allow(clippy::too_many_arguments)]
fn decoder(
    embedding_bytes: u64,
    layers: u32,
    layer_bytes: u64,
    kv_bytes: u64,
    layer_workspace: u64,
    hidden_bytes: u64,
    logits_bytes: u64,
    devices: Vec<Device>,
) -> Problem {
    let mut units = Vec::new();
    let mut embedding = unit("model.embed_tokens".into(), embedding_bytes);
    embedding.handoff_bytes = hidden_bytes;
    units.push(embedding);
    for i in 0..layers {
        let mut layer = unit(format!("model.layers.{i}"), layer_bytes);
        layer.peak_bytes = kv_bytes;
        layer.transient_bytes = layer_workspace;
        layer.handoff_bytes = hidden_bytes;
        layer.gpu_only = true;
        units.push(layer);
    }
    let mut norm = unit("model.norm".into(), 2 * 8192);
    norm.handoff_bytes = hidden_bytes;
    units.push(norm);
    let mut head = unit("lm_head".into(), embedding_bytes);
    head.transient_bytes = logits_bytes;
    units.push(head);
    for (k, u) in units.iter_mut().enumerate() {
        u.order = Some(k as u32);
    }
    Problem {
        units,
        devices,
        together: vec![],
        pins: vec![],
        ordered: true,
        min_devices: false,
        offload_runs_on: None,
    }
}

/// Llama-2-70B (bf16) inference, batch 1 × 4096 tokens, on 4 × A100-40GB in one node.
fn llama2_70b_a100x4() -> Problem {
    let limit = ((40_960u64 - 500) << 20) / 10 * 9;
    let fixed = 500 << 20;
    let layer_params = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192;
    decoder(
        32_000 * 8192 * 2,
        80,
        layer_params * 2,
        2 * 1024 * 4096 * 2,
        2 * 4096 * 28672 * 2,
        4096 * 8192 * 2,
        4096 * 32_000 * 4,
        gpus(4, limit - fixed, fixed, 4, (300_000_000_000, 0)),
    )
}

/// Mixtral-8x7B in 4-bit (4.5 bits a weight with the scales), batch 1 × 2048 tokens, on 2 × T4.
fn mixtral_8x7b_t4x2() -> Problem {
    let limit = ((15_360u64 - 400) << 20) / 10 * 9;
    let fixed = 300 << 20;
    let layer_params: u64 = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8;
    decoder(
        32_000 * 4096 * 2,
        32,
        layer_params * 9 / 16,
        2 * 1024 * 2048 * 2,
        2 * 2048 * 14336 * 2,
        2048 * 4096 * 2,
        2048 * 32_000 * 4,
        gpus(2, limit - fixed, fixed, 2, (16_000_000_000, 0)),
    )
}

fn bench(c: &mut Criterion) {
    let options = SolveOptions::default();
    let mut group = c.benchmark_group("ilp");
    group.sample_size(10);
    for (name, problem) in [
        ("mixtral_8x7b_4bit_t4x2", mixtral_8x7b_t4x2()),
        ("llama2_70b_a100_40gb_x4", llama2_70b_a100x4()),
        ("deepseek_v3_ep_h100_x32", deepseek_v3_ep32()),
    ] {
        let solution = ilp::solve(&problem, &options);
        eprintln!(
            "{name}: {:?}, objective {:.4}, bound {:.4}, gap {:.2e}, {:.3} s",
            solution.status, solution.objective, solution.bound, solution.gap, solution.seconds
        );
        group.bench_function(name, |b| b.iter(|| ilp::solve(black_box(&problem), &options)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
