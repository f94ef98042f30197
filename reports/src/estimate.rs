//! `vramplan estimate`'s report: for each device, where the memory goes at the peak (by
//! component), the three peak figures people measure, what is usable, the headroom or by how
//! much it runs out, and the moment of the step where the peak happens; then the verdict, the
//! vLLM KV capacity and the warnings.

use crate::table::{Table, group_digits};
use vramplan_profiles::units::format_bytes;
use vramplan_sim::estimate::{DeviceEstimate, Estimate, Part};
use vramplan_sim::workload::Parallelism;

/// What one rank holds under data parallelism, as the line that heads an estimate (or a check)
/// with one section per rank; `None` for one copy of the model. `ranks` is the profile's GPUs.
pub fn data_parallel_line(parallelism: &Parallelism, ranks: usize) -> Option<String> {
    let over = format!("over {ranks} GPU{}", if ranks == 1 { "" } else { "s" });
    let holds = match *parallelism {
        Parallelism::Ddp => format!(
            "DDP {over}: each rank holds a full replica, its gradients and optimizer states, and DDP's gradient \
             buckets (a second copy of the gradients: `gradient_as_bucket_view=False`, the default)"
        ),
        Parallelism::Zero { stage, offload_optimizer, offload_params } => {
            let shard = format!("1/{ranks}");
            let mut text = match stage {
                1 => format!(
                    "ZeRO-1 {over}: each rank holds the whole model and its gradients, and {shard} of the optimizer \
                     states and fp32 master weights"
                ),
                2 => format!(
                    "ZeRO-2 {over}: each rank holds the whole model, and {shard} of the gradients, optimizer \
                     states and fp32 master weights"
                ),
                _ => format!(
                    "ZeRO-3 / FSDP full shard {over}: each rank holds {shard} of the weights, gradients, optimizer \
                     states and fp32 master weights, and gathers each layer's weights around its compute"
                ),
            };
            if offload_optimizer {
                text += "; optimizer states in CPU memory";
            }
            if offload_params {
                text += "; parameters in CPU memory";
            }
            text
        }
        Parallelism::Single | Parallelism::Tensor { .. } => return None,
    };
    Some(format!(
        "data parallel, {holds}.\none section per rank, each against its own GPU's memory; --batch is each rank's \
         micro-batch\n\n"
    ))
}

/// The human report of an estimate.
pub fn estimate_table(estimate: &Estimate) -> String {
    let mut text = String::new();
    for device in &estimate.devices {
        text += &device_section(device);
        text += "\n";
    }
    if let Some(tokens) = estimate.kv_capacity_tokens {
        // vLLM's paged cache, or SGLang's token pool (`max_total_num_tokens`).
        text += &format!("KV cache capacity (the serving engine's): {} tokens\n", group_digits(tokens));
    }
    text += &verdict_line(estimate);
    if !estimate.warnings.is_empty() {
        text += "\nwarnings:\n";
        for warning in &estimate.warnings {
            text += &format!("  - {warning}\n");
        }
    }
    text
}

fn device_section(d: &DeviceEstimate) -> String {
    let mut text = format!("GPU {}  {}  {}\n", d.id, d.name, device_verdict(d));
    let c = &d.components;
    let mut parts = Table::new(&["at the peak", "bytes", "share"]).right_align(&[1, 2]);
    for part in Part::ALL {
        let name = match part {
            Part::Overhead => "overhead (CUDA context, workspaces, allocator slack)",
            _ => part_name(part),
        };
        let bytes = c.get(part);
        parts.row(&[name, &format_bytes(bytes), &share(bytes, d.device_used_bytes)]);
    }
    text += &parts.render();
    text += "\n";
    let mut peaks = Table::new(&["", ""]).without_header().right_align(&[1]);
    peaks.row(&["peak allocated (max_memory_allocated)", &format_bytes(d.peak_allocated_bytes)]);
    peaks.row(&["peak reserved (max_memory_reserved)", &format_bytes(d.peak_reserved_bytes)]);
    peaks.row(&["device used (nvidia-smi)", &format_bytes(d.device_used_bytes)]);
    peaks.row(&["capacity (nvidia-smi total)", &format_bytes(d.capacity_bytes)]);
    peaks.row(&["usable by PyTorch", &format_bytes(d.usable_bytes)]);
    peaks.row(&["headroom (usable − peak reserved)", &signed_bytes(d.usable_bytes, d.peak_reserved_bytes)]);
    peaks.row(&["peak at", &d.peak_at]);
    text += &peaks.render();
    text
}

/// `fits, 1.20 GiB to spare` or `OOM by 3.40 GiB`: the allocator's peak against what PyTorch
/// can use, the criterion of [`DeviceEstimate::fits`].
fn device_verdict(d: &DeviceEstimate) -> String {
    if d.fits {
        format!("fits, {} to spare", format_bytes(d.usable_bytes.saturating_sub(d.peak_reserved_bytes)))
    } else {
        format!("OOM by {}", format_bytes(d.peak_reserved_bytes.saturating_sub(d.usable_bytes)))
    }
}

fn verdict_line(estimate: &Estimate) -> String {
    if estimate.fits {
        let n = estimate.devices.len();
        return format!(
            "verdict: fits ({} GPU{}; largest device-used {})\n",
            n,
            if n == 1 { "" } else { "s" },
            format_bytes(estimate.peak_bytes)
        );
    }
    let short: Vec<String> = estimate
        .devices
        .iter()
        .filter(|d| !d.fits)
        .map(|d| {
            format!(
                "GPU {} OOM by {}",
                d.id,
                format_bytes(d.peak_reserved_bytes.saturating_sub(d.usable_bytes))
            )
        })
        .collect();
    format!("verdict: does not fit ({})\n", short.join(", "))
}

/// `a − b` as a size, with a minus sign when negative.
fn signed_bytes(a: u64, b: u64) -> String {
    if a >= b { format_bytes(a - b) } else { format!("−{}", format_bytes(b - a)) }
}

/// `part` as a percentage of `whole`, one decimal.
fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", 100.0 * part as f64 / whole as f64)
}

/// A component's name in sentences and tables.
pub fn part_name(part: Part) -> &'static str {
    match part {
        Part::Weights => "weights",
        Part::Gradients => "gradients",
        Part::Optimizer => "optimizer states",
        Part::Activations => "activations",
        Part::KvCache => "KV cache",
        Part::Logits => "logits and loss",
        Part::Overhead => "overhead",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramplan_sim::estimate::Components;

    fn device(fits: bool, reserved: u64) -> DeviceEstimate {
        DeviceEstimate {
            id: 0,
            name: "Tesla T4".into(),
            capacity_bytes: 15360 << 20,
            usable_bytes: 14 << 30,
            peak_allocated_bytes: reserved - (1 << 30),
            peak_reserved_bytes: reserved,
            device_used_bytes: reserved + (300 << 20),
            peak_at: "backward of model.layers.0".into(),
            steady_bytes: 0,
            loaded_bytes: reserved,
            components: Components { weights: reserved, overhead: 300 << 20, ..Components::default() },
            fits,
        }
    }

    #[test]
    fn oom_margin_is_reserved_minus_usable() {
        // 16 GiB reserved against 14 GiB usable: 2 GiB short.
        let e = Estimate {
            devices: vec![device(false, 16 << 30)],
            peak_bytes: (16 << 30) + (300 << 20),
            fits: false,
            kv_capacity_tokens: None,
            warnings: vec!["bf16 on T4".into()],
        };
        let text = estimate_table(&e);
        assert!(text.contains("OOM by 2.00 GiB"), "{text}");
        assert!(text.contains("−2.00 GiB"), "{text}");
        assert!(text.contains("  - bf16 on T4"), "{text}");
    }

    #[test]
    fn spare_is_usable_minus_reserved() {
        let e = Estimate {
            devices: vec![device(true, 13 << 30)],
            peak_bytes: 0,
            fits: true,
            kv_capacity_tokens: Some(123_456),
            warnings: Vec::new(),
        };
        let text = estimate_table(&e);
        assert!(text.contains("fits, 1.00 GiB to spare"), "{text}");
        assert!(text.contains("123,456 tokens"), "{text}");
    }
}
