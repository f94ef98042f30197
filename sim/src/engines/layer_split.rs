//! llama.cpp's layer split (`--split-mode layer`, its default): which device holds each of the
//! `n_layer + 1` slots of a model (the repeating layers `0..n_layer`, then the output layer as
//! slot `n_layer`). The one copy of the rule in the workspace; the estimate places a model with
//! it when no map or plan is given. Source: llama.cpp `src/llama-model.cpp`,
//! `llama_model::load_tensors`:
//!
//! - the split points: with no `-ts` (`tensor_split` all zero), each device's weight is its free
//!   memory (`ggml_backend_dev_memory`, CUDA's `cudaMemGetInfo` once the device's context exists);
//!   with `-ts`, the given values. They are summed in `float` into cumulative points and divided
//!   by the sum: `splits[i] = Σ_{j ≤ i} w[j] / Σ w`;
//! - `n_gpu_layers` (`-ngl`; negative, the default, means all: `n_layer + 1`),
//!   `i_gpu_start = max(n_layer + 1 − n_gpu_layers, 0)` and
//!   `act_gpu_layers = min(n_gpu_layers, n_layer + 1)`;
//! - slot `il` is on the CPU when `il < i_gpu_start` or `il − i_gpu_start ≥ act_gpu_layers`, else
//!   on device `upper_bound(splits, float(il − i_gpu_start) / act_gpu_layers)`, the first split
//!   point greater than that fraction;
//! - the input layer (`token_embd`) is always on the CPU.
//!
//! So with every layer offloaded the output layer is the last slot, on the last device that gets
//! any slot, and each device gets a contiguous range of layers in proportion to its free memory.

/// The cumulative split points llama.cpp computes from per-device weights (free bytes, or the
/// `-ts` values), in `float` as it does. An empty or all-zero list gives no points.
pub fn split_points(weights: &[f64]) -> Vec<f32> {
    let mut points: Vec<f32> = Vec::with_capacity(weights.len());
    let mut sum = 0.0f32;
    for w in weights {
        sum += *w as f32;
        points.push(sum);
    }
    if sum > 0.0 {
        for p in &mut points {
            *p /= sum;
        }
    }
    points
}

/// The device of every slot (`0..n_layer` the layers, `n_layer` the output layer): `Some(i)` for
/// the `i`-th device of `points`, `None` for the CPU. `n_gpu_layers` is `-ngl` (`None`: all, the
/// default). No devices (no points) puts every slot on the CPU.
pub fn slots(n_layer: usize, n_gpu_layers: Option<usize>, points: &[f32]) -> Vec<Option<usize>> {
    let all = n_layer + 1;
    let ngl = n_gpu_layers.unwrap_or(all);
    let start = all.saturating_sub(ngl);
    let active = if points.is_empty() { 0 } else { ngl.min(all) };
    (0..all)
        .map(|il| {
            if il < start || il - start >= active {
                return None;
            }
            let x = (il - start) as f32 / active as f32;
            // std::upper_bound: the first point greater than x.
            let device = points.iter().position(|&p| x < p).unwrap_or(points.len() - 1);
            Some(device)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_devices_split_the_slots_evenly_with_the_output_last() {
        let points = split_points(&[1.0, 1.0]);
        let s = slots(32, None, &points);
        // 33 slots: x = il / 33 < 0.5 for il ≤ 16, so GPU 0 gets layers 0..=16 (17 slots).
        assert_eq!(s.iter().filter(|d| **d == Some(0)).count(), 17);
        assert_eq!(s[32], Some(1));
        assert!(s[..17].iter().all(|d| *d == Some(0)) && s[17..].iter().all(|d| *d == Some(1)));
    }

    #[test]
    fn partial_offload_keeps_the_first_slots_on_the_cpu() {
        // -ngl 20 on 32 layers: slots 13..=32 (19 layers and the output) on the GPU.
        let s = slots(32, Some(20), &split_points(&[1.0]));
        assert!(s[..13].iter().all(Option::is_none));
        assert!(s[13..].iter().all(|d| *d == Some(0)));
    }

    #[test]
    fn no_device_or_no_weight_is_all_cpu() {
        assert!(slots(4, None, &[]).iter().all(Option::is_none));
        assert!(split_points(&[0.0, 0.0]).iter().all(|p| *p == 0.0));
    }
}
