//! Hardware profiles: the GPUs a plan runs on, their memory and what of it PyTorch can use, and
//! the links between them.
//!
//! A profile comes from a built-in name (`t4`, `a100-80gb-x4`, see [`builtin_names`]), a short
//! form (`2xt4`, `4xa100-80gb`, `rtx4090+rtx3090`) or a YAML file; [`load`] takes any of them.
//! Every GPU model is defined once, in the embedded catalog `catalog/hardware/gpus.yaml`, with
//! its sources; profiles refer to it by key. The schema, the built-ins and every default with its
//! source are in `docs/hardware-profiles.md`.
//!
//! Memory is what `nvidia-smi` reports as total. Two reserves come off it before tensors:
//! the driver's (memory the CUDA driver never hands out: nvidia-smi's total minus
//! `cudaMemGetInfo`'s total) and the CUDA context's (context plus the kernels a PyTorch process
//! loads), see [`Device::usable_bytes`].

mod catalog;
mod prices;
mod resolve;
mod schema;
mod short_form;
mod write;

pub use prices::Prices;

use crate::InputError;
use crate::suggest::ticked_or;
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// A machine (or cluster) to plan for: devices in order, flattened over nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HardwareProfile {
    /// The profile's name: the YAML's `name` (else the file's stem), the built-in's name, or the
    /// short form as written (`2xt4`).
    pub name: String,
    /// The YAML's `description`, or for a short form the devices and link in words; may be empty.
    pub description: String,
    /// All devices, numbered from 0 in profile order; `Device::node` says which node holds each.
    pub devices: Vec<Device>,
    /// The nodes, numbered from 0: the link between GPUs of a node and the node's host.
    pub nodes: Vec<Node>,
    /// The network between nodes (per GPU pair, per direction); present when there are several.
    pub inter_node_link: Option<Link>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Device {
    /// Position in the profile, from 0.
    pub index: u32,
    /// The node that holds it, from 0.
    pub node: u32,
    /// The catalog key it was made from (`a100-80gb`), if any.
    pub model: Option<String>,
    /// The name `nvidia-smi` prints (`NVIDIA A100-SXM4-80GB`).
    pub name: String,
    /// Architecture generation (`Ampere`), from the compute capability; `unknown` outside the table.
    pub generation: String,
    /// Total memory as `nvidia-smi` reports it.
    pub memory_bytes: u64,
    /// Memory the driver keeps: `nvidia-smi`'s total minus the total `cudaMemGetInfo` reports.
    pub driver_reserve_bytes: u64,
    /// Where `driver_reserve_bytes` comes from (free text): the profile's
    /// `driver_reserve_source`, `set in FILE`, or the generation's default with its source.
    pub driver_reserve_source: String,
    /// The CUDA context of a PyTorch process with the kernels it loads, before any tensor.
    pub context_reserve_bytes: u64,
    /// Where `context_reserve_bytes` comes from (free text): the profile's
    /// `context_reserve_source`, `set in FILE`, or the generation's default with its source.
    pub context_reserve_source: String,
    /// CUDA compute capability (`8.0` for an A100), as `nvidia-smi --query-gpu=compute_cap`
    /// prints it; it picks the generation and its defaults.
    pub compute_capability: ComputeCapability,
    /// Tensor-core bf16 (Ampere and later).
    pub bf16: bool,
    /// Tensor-core fp8 (Ada and Hopper).
    pub fp8: bool,
    /// Peak memory bandwidth from the datasheet.
    pub bandwidth_bytes_per_s: u64,
    /// The host interface.
    pub pcie: Pcie,
    /// NVLink ports, for SXM parts: generation and all links together, per direction.
    pub nvlink: Option<Nvlink>,
}

/// CUDA compute capability, e.g. 8.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ComputeCapability {
    /// The major version: 8 in 8.6.
    pub major: u32,
    /// The minor version: 6 in 8.6.
    pub minor: u32,
}

/// A PCIe host interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pcie {
    /// PCIe generation, 1 to 5 (`PCIe Generation: Max` in `nvidia-smi -q`).
    pub generation: u32,
    /// Link width in lanes: 1, 2, 4, 8 or 16 (16 unless the profile says otherwise).
    pub lanes: u32,
}

/// A GPU's NVLink ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Nvlink {
    /// NVLink generation, 1 to 5 (3 on A100, 4 on H100).
    pub generation: u32,
    /// All links together, per direction (half the bidirectional figure of datasheets).
    pub bandwidth_bytes_per_s: u64,
}

/// A link between devices: bandwidth available to one device pair, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Link {
    /// What the link is made of (the YAML's `kind`).
    pub kind: LinkKind,
    /// The link's generation (NVLink or PCIe), when the profile gives one.
    pub generation: Option<u32>,
    /// Bytes per second available to one device pair, per direction (the YAML's `bandwidth`).
    pub bandwidth_bytes_per_s: u64,
}

/// What a [`Link`] is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// NVLink between GPUs of a node (an SXM baseboard, NVSwitch or an NVLink bridge).
    Nvlink,
    /// PCIe between GPUs of a node, through the host's PCIe switches.
    Pcie,
    /// InfiniBand between nodes.
    Infiniband,
    /// Ethernet between nodes.
    Ethernet,
}

/// One node (machine) of a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// Position among the profile's nodes, from 0; [`Device::node`] refers to it.
    pub index: u32,
    /// The link between any two GPUs of this node; `None` when they only share PCIe, in which
    /// case a transfer runs at the slower of the two GPUs' PCIe links.
    pub gpu_link: Option<Link>,
    /// The node's host RAM and disk, for offload (the YAML's `host`).
    pub host: Host,
}

/// Host memory and disk of a node, for offload; `None` where the profile does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Host {
    /// Host RAM in bytes (the YAML's `host.ram`), where CPU-offloaded weights go.
    pub ram_bytes: Option<u64>,
    /// Disk space in bytes (the YAML's `host.disk`), where disk-offloaded weights go.
    pub disk_bytes: Option<u64>,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Device {
    /// Memory left for PyTorch's allocator: total minus the driver and context reserves.
    pub fn usable_bytes(&self) -> u64 {
        self.memory_bytes.saturating_sub(self.driver_reserve_bytes).saturating_sub(self.context_reserve_bytes)
    }

    /// The device's PCIe bandwidth per direction (lanes × rate × encoding).
    pub fn pcie_bandwidth_bytes_per_s(&self) -> u64 {
        catalog::pcie_bandwidth(self.pcie).unwrap_or(0)
    }
}

impl HardwareProfile {
    /// Bytes per second, per direction, between devices `a` and `b`: the node's GPU link (NVLink)
    /// inside a node, else the slower of the two PCIe links; across nodes the inter-node link,
    /// capped by either GPU's PCIe (the path to the NIC). `a == b` gives the device's memory
    /// bandwidth; an index that is not a device gives 0.
    pub fn link_bandwidth(&self, a: u32, b: u32) -> u64 {
        let (Some(da), Some(db)) = (self.device(a), self.device(b)) else { return 0 };
        if a == b {
            return da.bandwidth_bytes_per_s;
        }
        let pcie = da.pcie_bandwidth_bytes_per_s().min(db.pcie_bandwidth_bytes_per_s());
        if da.node == db.node {
            match self.nodes.iter().find(|n| n.index == da.node).and_then(|n| n.gpu_link) {
                Some(link) => link.bandwidth_bytes_per_s,
                None => pcie,
            }
        } else {
            self.inter_node_link.map_or(0, |link| link.bandwidth_bytes_per_s.min(pcie))
        }
    }

    /// The device with this index.
    pub fn device(&self, index: u32) -> Option<&Device> {
        self.devices.iter().find(|d| d.index == index)
    }

    /// The devices of one node, in order.
    pub fn devices_of(&self, node: u32) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(move |d| d.node == node)
    }
}

/// Loads a profile from what the user typed: a built-in name, a short form (`2xt4`,
/// `4xa100-80gb`, `rtx4090+rtx3090`, `2xt4+rtx4090`) or a path to a YAML file.
pub fn load(spec: &str) -> Result<HardwareProfile, InputError> {
    let trimmed = spec.trim();
    if trimmed.is_empty() {
        return Err(InputError::new("--hardware", "no hardware profile given").with_fix(format!(
            "name a built-in ({}), a short form such as `2xt4`, or a YAML file",
            builtin_names().join(", ")
        )));
    }
    let lower = trimmed.to_ascii_lowercase();
    if let Some(text) = catalog::builtin_yaml(&lower) {
        return resolve::profile_from_yaml(text, &format!("built-in profile `{lower}`"), &lower);
    }
    let path = Path::new(trimmed);
    let looks_like_path =
        lower.ends_with(".yaml") || lower.ends_with(".yml") || trimmed.contains(['/', '\\']);
    if looks_like_path || path.is_file() {
        let text = crate::files::read_text(path, crate::files::FileKind::Hardware).map_err(|e| {
            e.with_fix(format!(
                "give the path of a hardware profile YAML, a built-in name ({}) or a short form such as `2xt4`",
                builtin_names().join(", ")
            ))
        })?;
        let stem = path.file_stem().map_or_else(|| trimmed.to_string(), |s| s.to_string_lossy().into_owned());
        return resolve::profile_from_yaml(&text, &path.display().to_string(), &stem);
    }
    if let Some(result) = short_form::parse(trimmed) {
        return result;
    }
    Err(unknown_profile(trimmed))
}

fn unknown_profile(spec: &str) -> InputError {
    let names = builtin_names();
    let gpu_keys = catalog::catalog().map(|c| c.gpu_keys()).unwrap_or_default();
    let lower = spec.to_ascii_lowercase();
    let err = InputError::new(spec, "not a built-in hardware profile, a short form or a file");
    // `rtx4090x2` (count after the name) is a common slip: suggest the prefix form.
    if let Some((name, count)) = lower.rsplit_once('x')
        && !count.is_empty()
        && count.chars().all(|c| c.is_ascii_digit())
        && gpu_keys.contains(&name)
    {
        return err.with_fix(format!("write the count first: `{count}x{name}`"));
    }
    let candidates: Vec<&str> = names.iter().chain(gpu_keys.iter()).copied().collect();
    match suggestions(&lower, &candidates).as_slice() {
        [] => err.with_fix(format!(
            "use a built-in ({}), a short form such as `2xt4` or `rtx4090+rtx3090`, or a YAML file",
            names.join(", ")
        )),
        close => err.with_fix(format!("did you mean {}? Built-ins: {}", ticked_or(close), names.join(", "))),
    }
}

/// Names of the built-in profiles: single GPUs by memory, then multi-GPU machines by total memory.
pub fn builtin_names() -> Vec<&'static str> {
    catalog::builtin_names()
}

/// `profile` as YAML that [`load`] reads back to an equal profile.
pub fn to_yaml(profile: &HardwareProfile) -> String {
    write::to_yaml(profile)
}

/// Names close to `wanted`: those it begins (`a100` → `a100-40gb`, `a100-80gb`), else those at
/// edit distance 1 or 2, nearest first; at most three, without repeats.
fn suggestions<'a>(wanted: &str, candidates: &[&'a str]) -> Vec<&'a str> {
    let mut found: Vec<&'a str> = Vec::new();
    if wanted.len() >= 2 {
        for name in candidates.iter().copied().filter(|c| c.starts_with(wanted)) {
            if !found.contains(&name) {
                found.push(name);
            }
        }
    }
    if found.is_empty() {
        let mut near: Vec<(usize, &'a str)> = candidates
            .iter()
            .map(|c| (crate::suggest::edit_distance(wanted, c), *c))
            .filter(|(d, _)| *d <= 2)
            .collect();
        near.sort_by_key(|(d, _)| *d);
        for (_, name) in near {
            if !found.contains(&name) {
                found.push(name);
            }
        }
    }
    found.truncate(3);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_prefer_names_that_begin_with_the_input_then_small_edits() {
        let names = ["t4", "rtx4090", "a10g", "a100-40gb", "a100-80gb", "a100-80gb-x4"];
        assert_eq!(suggestions("rtx490", &names), ["rtx4090"]);
        assert_eq!(suggestions("a100", &names), ["a100-40gb", "a100-80gb", "a100-80gb-x4"]);
        assert_eq!(suggestions("a10", &names), ["a10g", "a100-40gb", "a100-80gb"]);
        assert!(suggestions("mi300x", &names).is_empty());
    }

    #[test]
    fn the_default_link_splits_nvlink_on_small_meshes_and_not_behind_nvswitch() {
        // HGX A100 4-GPU: 12 NVLink 3 links of 25 GB/s per direction per GPU, 4 to each of 3
        // peers = 100 GB/s per pair; HGX H100 8-GPU: NVSwitch, 450 GB/s per pair.
        let a4 = load("4xa100-80gb").unwrap();
        assert_eq!(a4.nodes[0].gpu_link.map(|l| l.bandwidth_bytes_per_s), Some(100_000_000_000));
        let h8 = load("8xh100-80gb").unwrap();
        assert_eq!(h8.nodes[0].gpu_link.map(|l| l.bandwidth_bytes_per_s), Some(450_000_000_000));
        let t2 = load("2xt4").unwrap();
        assert_eq!(t2.nodes[0].gpu_link, None);
    }
}
