//! Writes a profile as YAML that loads back to the same profile: every device spelled out (with
//! its catalog key as `gpu:` when it has one), runs of identical devices and nodes folded into
//! `count`, sizes and rates printed exactly.

use super::{Device, HardwareProfile, Host, Link, LinkKind, Node};
use std::fmt::Write as _;

/// The YAML text of `profile`.
pub(super) fn to_yaml(profile: &HardwareProfile) -> String {
    let mut out = String::new();
    out += "# vramplan hardware profile; sizes are exact, and this file loads back unchanged\n";
    out += "# (schema: docs/hardware-profiles.md).\n";
    let _ = writeln!(out, "name: {}", quote(&profile.name));
    let _ = writeln!(out, "description: {}", quote(&profile.description));
    let groups = node_groups(profile);
    match groups.as_slice() {
        [(node, 1)] => write_node(&mut out, profile, node, ""),
        _ => {
            out += "nodes:\n";
            for (node, count) in &groups {
                let _ = writeln!(out, "  - count: {count}");
                write_node(&mut out, profile, node, "    ");
            }
        }
    }
    if let Some(link) = &profile.inter_node_link {
        let _ = writeln!(out, "inter_node_link: {}", link_text(link));
    }
    out
}

/// Consecutive nodes with the same devices, link and host, with how many there are.
fn node_groups(profile: &HardwareProfile) -> Vec<(&Node, usize)> {
    let mut groups: Vec<(&Node, usize)> = Vec::new();
    for node in &profile.nodes {
        match groups.last_mut() {
            Some((last, count)) if same_node(profile, last, node) => *count += 1,
            _ => groups.push((node, 1)),
        }
    }
    groups
}

fn same_node(profile: &HardwareProfile, a: &Node, b: &Node) -> bool {
    let devices_a: Vec<&Device> = profile.devices_of(a.index).collect();
    let devices_b: Vec<&Device> = profile.devices_of(b.index).collect();
    a.gpu_link == b.gpu_link
        && a.host == b.host
        && devices_a.len() == devices_b.len()
        && devices_a.iter().zip(&devices_b).all(|(x, y)| same_device(x, y))
}

/// Equal but for the place (index and node).
fn same_device(a: &Device, b: &Device) -> bool {
    Device { index: 0, node: 0, ..a.clone() } == Device { index: 0, node: 0, ..b.clone() }
}

fn write_node(out: &mut String, profile: &HardwareProfile, node: &Node, indent: &str) {
    let _ = writeln!(out, "{indent}devices:");
    let devices: Vec<&Device> = profile.devices_of(node.index).collect();
    let mut start = 0;
    while let Some(first) = devices.get(start) {
        let run = devices[start..].iter().take_while(|d| same_device(d, first)).count();
        write_device(out, first, run, indent);
        start += run.max(1);
    }
    if let Some(link) = &node.gpu_link {
        let _ = writeln!(out, "{indent}gpu_link: {}", link_text(link));
    }
    if node.host != Host::default() {
        let mut fields = Vec::new();
        if let Some(ram) = node.host.ram_bytes {
            fields.push(format!("ram: {}", format_size(ram)));
        }
        if let Some(disk) = node.host.disk_bytes {
            fields.push(format!("disk: {}", format_size(disk)));
        }
        let _ = writeln!(out, "{indent}host: {{{}}}", fields.join(", "));
    }
}

fn write_device(out: &mut String, device: &Device, count: usize, indent: &str) {
    let mut lines = Vec::new();
    if let Some(model) = &device.model {
        lines.push(format!("gpu: {}", quote(model)));
    }
    if count > 1 {
        lines.push(format!("count: {count}"));
    }
    lines.push(format!("name: {}", quote(&device.name)));
    lines.push(format!("memory: {}", format_mib(device.memory_bytes)));
    lines.push(format!("driver_reserve: {}", format_mib(device.driver_reserve_bytes)));
    lines.push(format!("driver_reserve_source: {}", quote(&device.driver_reserve_source)));
    lines.push(format!("context_reserve: {}", format_mib(device.context_reserve_bytes)));
    lines.push(format!("context_reserve_source: {}", quote(&device.context_reserve_source)));
    lines.push(format!("compute_capability: \"{}\"", device.compute_capability));
    lines.push(format!("bf16: {}", device.bf16));
    lines.push(format!("fp8: {}", device.fp8));
    lines.push(format!("memory_bandwidth: {}", format_rate(device.bandwidth_bytes_per_s)));
    lines.push(format!("pcie: {{generation: {}, lanes: {}}}", device.pcie.generation, device.pcie.lanes));
    if let Some(nvlink) = &device.nvlink {
        lines.push(format!(
            "nvlink: {{generation: {}, bandwidth: {}}}",
            nvlink.generation,
            format_rate(nvlink.bandwidth_bytes_per_s)
        ));
    }
    for (i, line) in lines.iter().enumerate() {
        let bullet = if i == 0 { "- " } else { "  " };
        let _ = writeln!(out, "{indent}  {bullet}{line}");
    }
}

fn link_text(link: &Link) -> String {
    let kind = match link.kind {
        LinkKind::Nvlink => "nvlink",
        LinkKind::Pcie => "pcie",
        LinkKind::Infiniband => "infiniband",
        LinkKind::Ethernet => "ethernet",
    };
    match link.generation {
        Some(generation) => {
            format!(
                "{{kind: {kind}, generation: {generation}, bandwidth: {}}}",
                format_rate(link.bandwidth_bytes_per_s)
            )
        }
        None => format!("{{kind: {kind}, bandwidth: {}}}", format_rate(link.bandwidth_bytes_per_s)),
    }
}

/// A size exactly, in the largest unit that divides it: decimal units first (`400MB`, `2TB`, as
/// datasheets and clouds write them), then binary ones (`1GiB`), else bytes.
pub(super) fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 8] = [
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("kB", 1_000),
    ];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{name}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// Device memory and reserves in MiB, as `nvidia-smi` prints them, when exact; else as
/// [`format_size`].
fn format_mib(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) { format!("{}MiB", bytes / MIB) } else { format_size(bytes) }
}

/// A rate exactly, in decimal units as datasheets give them (`3350GB/s`).
pub(super) fn format_rate(bytes_per_s: u64) -> String {
    const UNITS: [(&str, u64); 4] =
        [("TB", 1_000_000_000_000), ("GB", 1_000_000_000), ("MB", 1_000_000), ("kB", 1_000)];
    for (name, size) in UNITS {
        if bytes_per_s >= size && bytes_per_s.is_multiple_of(size) {
            return format!("{}{name}/s", bytes_per_s / size);
        }
    }
    format!("{bytes_per_s}B/s")
}

/// A YAML double-quoted string.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            '\t' => out += "\\t",
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_print_exactly_in_the_largest_unit() {
        assert_eq!(format_size(15_360 * 1_048_576), "15GiB");
        assert_eq!(format_mib(15_360 * 1_048_576), "15360MiB");
        assert_eq!(format_mib(400_000_000), "400MB");
        assert_eq!(format_size(30_720_000_000_000), "30720GB");
        assert_eq!(format_size(400_000_000), "400MB");
        assert_eq!(format_size(2_000_000_000_000), "2TB");
        assert_eq!(format_size(1_234_567), "1234567B");
        assert_eq!(format_rate(3_350_000_000_000), "3350GB/s");
        assert_eq!(format_rate(4_800_000_000_000), "4800GB/s");
        assert_eq!(format_rate(31_507_692_307), "31507692307B/s");
    }

    #[test]
    fn quoting_escapes_what_yaml_needs() {
        assert_eq!(quote("a \"b\" \\ c"), "\"a \\\"b\\\" \\\\ c\"");
        assert_eq!(quote("line\nnext"), "\"line\\nnext\"");
        assert_eq!(quote("2× T4"), "\"2× T4\"");
    }
}
