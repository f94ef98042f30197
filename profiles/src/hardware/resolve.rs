//! From the YAML as written to a [`HardwareProfile`]: catalog references resolved and overridden,
//! generation defaults filled in (reserves, bf16/fp8), counts and nodes expanded, default links
//! chosen, and every value checked, each error pointing at the value's line and key path.

use super::catalog::{self, Generation};
use super::schema::{
    self, DeviceEntry, HostEntry, LinkEntry, NodeEntry, ProfileFile, Scalar, error_at, indexed, key_path,
};
use super::{ComputeCapability, Device, HardwareProfile, Host, Link, LinkKind, Node, Nvlink, Pcie};
use crate::InputError;
use serde_saphyr::{Location, Spanned};

/// Most copies of one device entry, or of one node entry.
pub(super) const MAX_COUNT: u32 = 1024;
/// Most devices in one profile.
pub(super) const MAX_DEVICES: usize = 4096;

/// A reserve and where its figure comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sourced {
    pub bytes: u64,
    pub source: String,
}

/// A device as far as it is described: every field optional, so that an entry can override a
/// catalog GPU key by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct DeviceSpec {
    pub model: Option<String>,
    pub name: Option<String>,
    pub memory: Option<u64>,
    pub driver_reserve: Option<Sourced>,
    pub context_reserve: Option<Sourced>,
    pub compute_capability: Option<ComputeCapability>,
    pub bf16: Option<bool>,
    pub fp8: Option<bool>,
    pub memory_bandwidth: Option<u64>,
    pub pcie: Option<Pcie>,
    pub nvlink: Option<Nvlink>,
}

impl DeviceSpec {
    /// `self`'s keys, then `base`'s where `self` has none.
    fn over(self, base: &DeviceSpec) -> DeviceSpec {
        DeviceSpec {
            model: self.model.or_else(|| base.model.clone()),
            name: self.name.or_else(|| base.name.clone()),
            memory: self.memory.or(base.memory),
            driver_reserve: self.driver_reserve.or_else(|| base.driver_reserve.clone()),
            context_reserve: self.context_reserve.or_else(|| base.context_reserve.clone()),
            compute_capability: self.compute_capability.or(base.compute_capability),
            bf16: self.bf16.or(base.bf16),
            fp8: self.fp8.or(base.fp8),
            memory_bandwidth: self.memory_bandwidth.or(base.memory_bandwidth),
            pcie: self.pcie.or(base.pcie),
            nvlink: self.nvlink.or(base.nvlink),
        }
    }
}

/// Reads the keys an entry gives (not `gpu` and `count`), checking each value.
pub(super) fn parse_device_entry(
    origin: &str,
    entry: &DeviceEntry,
    prefix: &str,
) -> Result<DeviceSpec, InputError> {
    let key = |name: &str| key_path(prefix, name).into_owned();
    let mut spec =
        DeviceSpec { name: entry.name.as_ref().map(|n| n.value.trim().to_string()), ..Default::default() };
    if let Some(name) = &entry.name
        && name.value.trim().is_empty()
    {
        return Err(error_at(origin, &name.referenced, &key("name"), "the name is empty")
            .with_fix("write the name nvidia-smi prints, e.g. `NVIDIA A100-SXM4-80GB`"));
    }
    if let Some(memory) = &entry.memory {
        let bytes = schema::parse_size(origin, memory, &key("memory"), "15360MiB")?;
        if bytes == 0 {
            return Err(error_at(origin, &memory.referenced, &key("memory"), "device memory cannot be zero")
                .with_fix("write the total `nvidia-smi` reports, e.g. `15360MiB`"));
        }
        spec.memory = Some(bytes);
    }
    spec.driver_reserve = parse_reserve(
        origin,
        entry.driver_reserve.as_ref(),
        entry.driver_reserve_source.as_ref(),
        &key("driver_reserve"),
        "470MiB",
    )?;
    spec.context_reserve = parse_reserve(
        origin,
        entry.context_reserve.as_ref(),
        entry.context_reserve_source.as_ref(),
        &key("context_reserve"),
        "400MB",
    )?;
    if let Some(value) = &entry.compute_capability {
        let (major, minor) = schema::parse_compute_capability(origin, value, &key("compute_capability"))?;
        spec.compute_capability = Some(ComputeCapability { major, minor });
    }
    spec.bf16 = entry.bf16;
    spec.fp8 = entry.fp8;
    if let Some(value) = &entry.memory_bandwidth {
        spec.memory_bandwidth =
            Some(schema::parse_rate(origin, value, &key("memory_bandwidth"), "2039GB/s")?);
    }
    if let Some(pcie) = &entry.pcie {
        let generation = pcie.value.generation.value;
        let lanes = pcie.value.lanes.as_ref().map_or(16, |l| l.value);
        let parsed = Pcie { generation, lanes };
        if catalog::pcie_bandwidth(parsed).is_none() {
            return Err(error_at(
                origin,
                &pcie.value.generation.referenced,
                &key("pcie.generation"),
                format!("PCIe generation {generation} is not one vramplan knows (1 to 5)"),
            )
            .with_fix("write the generation `nvidia-smi -q` shows under `PCIe Generation: Max`"));
        }
        if ![1, 2, 4, 8, 16].contains(&lanes) {
            let location = pcie.value.lanes.as_ref().map_or(&pcie.referenced, |l| &l.referenced);
            return Err(error_at(
                origin,
                location,
                &key("pcie.lanes"),
                format!("{lanes} is not a PCIe link width"),
            )
            .with_fix("write 1, 2, 4, 8 or 16 (`nvidia-smi -q`, `Link Width: Max`)"));
        }
        spec.pcie = Some(parsed);
    }
    if let Some(nvlink) = &entry.nvlink {
        let generation = nvlink.value.generation.value;
        if !(1..=5).contains(&generation) {
            return Err(error_at(
                origin,
                &nvlink.value.generation.referenced,
                &key("nvlink.generation"),
                format!("NVLink generation {generation} does not exist (1 to 5)"),
            ));
        }
        let bandwidth =
            schema::parse_rate(origin, &nvlink.value.bandwidth, &key("nvlink.bandwidth"), "300GB/s")?;
        spec.nvlink = Some(Nvlink { generation, bandwidth_bytes_per_s: bandwidth });
    }
    Ok(spec)
}

fn parse_reserve(
    origin: &str,
    value: Option<&Spanned<Scalar>>,
    source: Option<&String>,
    key: &str,
    example: &str,
) -> Result<Option<Sourced>, InputError> {
    match (value, source) {
        (Some(value), source) => {
            let bytes = schema::parse_size(origin, value, key, example)?;
            let source = match source {
                Some(text) if !text.trim().is_empty() => text.trim().to_string(),
                _ => format!("set in {origin}"),
            };
            Ok(Some(Sourced { bytes, source }))
        }
        (None, Some(_)) => Err(InputError::new(origin, format!("`{key}_source` is given without `{key}`"))
            .at_key(format!("{key}_source"))
            .with_fix(format!("give the figure too, e.g. `{key}: {example}`"))),
        (None, None) => Ok(None),
    }
}

/// A complete device without its place (index and node).
pub(super) fn finalize_device(
    spec: &DeviceSpec,
    generations: &[Generation],
    origin: &str,
    location: &Location,
    key: &str,
) -> Result<Device, InputError> {
    let missing = |what: &str, example: &str| {
        error_at(
            origin,
            location,
            key,
            format!("no `{what}` given, and no catalog GPU (`gpu:`) to take it from"),
        )
        .with_fix(format!("add `{what}: {example}`, or refer to a catalog GPU with `gpu:`"))
    };
    let name = spec.name.clone().ok_or_else(|| missing("name", "NVIDIA A100-SXM4-80GB"))?;
    let memory = spec.memory.ok_or_else(|| missing("memory", "81920MiB"))?;
    let capability = spec.compute_capability.ok_or_else(|| missing("compute_capability", "\"8.0\""))?;
    let bandwidth = spec.memory_bandwidth.ok_or_else(|| missing("memory_bandwidth", "2039GB/s"))?;
    let pcie = spec.pcie.ok_or_else(|| missing("pcie", "{generation: 4, lanes: 16}"))?;
    let generation = generations.iter().find(|g| g.compute_capabilities.contains(&capability));
    let (driver_reserve, context_reserve, bf16, fp8) = match generation {
        Some(g) => (
            spec.driver_reserve.clone().unwrap_or_else(|| Sourced {
                bytes: g.driver_reserve,
                source: format!("{} default: {}", g.name, g.driver_reserve_source),
            }),
            spec.context_reserve.clone().unwrap_or_else(|| Sourced {
                bytes: g.context_reserve,
                source: format!("{} default: {}", g.name, g.context_reserve_source),
            }),
            spec.bf16.unwrap_or(g.bf16),
            spec.fp8.unwrap_or(g.fp8),
        ),
        None => match (&spec.driver_reserve, &spec.context_reserve, spec.bf16, spec.fp8) {
            (Some(driver), Some(context), Some(bf16), Some(fp8)) => {
                (driver.clone(), context.clone(), bf16, fp8)
            }
            _ => {
                let missing: Vec<&str> = [
                    ("driver_reserve", spec.driver_reserve.is_none()),
                    ("context_reserve", spec.context_reserve.is_none()),
                    ("bf16", spec.bf16.is_none()),
                    ("fp8", spec.fp8.is_none()),
                ]
                .into_iter()
                .filter_map(|(name, absent)| absent.then_some(name))
                .collect();
                return Err(error_at(
                    origin,
                    location,
                    key,
                    format!(
                        "compute capability {capability} is outside vramplan's generation table (Volta 7.0 to \
                         Hopper 9.0), so {} have no default",
                        missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
                    ),
                )
                .with_fix(
                    "give them for this device, e.g. `driver_reserve: 500MiB`, `context_reserve: 500MiB`, `bf16: true`, \
                     `fp8: true` (docs/hardware-profiles.md says how to measure the reserves)",
                ));
            }
        },
    };
    let reserved = driver_reserve.bytes.saturating_add(context_reserve.bytes);
    if reserved >= memory {
        return Err(error_at(
            origin,
            location,
            key,
            format!(
                "the reserves ({} driver + {} context) leave nothing of the {} of memory",
                crate::units::format_bytes(driver_reserve.bytes),
                crate::units::format_bytes(context_reserve.bytes),
                crate::units::format_bytes(memory)
            ),
        )
        .with_fix("check `memory` (nvidia-smi's total) and the reserves"));
    }
    Ok(Device {
        index: 0,
        node: 0,
        model: spec.model.clone(),
        name,
        generation: generation.map_or_else(|| "unknown".to_string(), |g| g.name.clone()),
        memory_bytes: memory,
        driver_reserve_bytes: driver_reserve.bytes,
        driver_reserve_source: driver_reserve.source,
        context_reserve_bytes: context_reserve.bytes,
        context_reserve_source: context_reserve.source,
        compute_capability: capability,
        bf16,
        fp8,
        bandwidth_bytes_per_s: bandwidth,
        pcie,
        nvlink: spec.nvlink,
    })
}

/// A device of the catalog, by key, with nothing overridden (short forms).
pub(super) fn catalog_device(key: &str) -> Result<Option<Device>, InputError> {
    let catalog = catalog::catalog()?;
    let Some(gpu) = catalog.gpu(key) else { return Ok(None) };
    let unknown = Location::UNKNOWN;
    finalize_device(&gpu.spec, &catalog.generations, "built-in GPU catalog", &unknown, &format!("gpus.{key}"))
        .map(Some)
}

/// A node before its devices are numbered.
pub(super) struct NodeDraft {
    pub devices: Vec<Device>,
    pub gpu_link: Option<Link>,
    pub host: Host,
}

/// Numbers devices and nodes and checks the whole: the last step of every way in.
pub(super) fn assemble(
    name: String,
    description: String,
    nodes: Vec<NodeDraft>,
    inter_node_link: Option<Link>,
) -> HardwareProfile {
    let mut devices = Vec::new();
    let mut node_list = Vec::new();
    for (node_index, draft) in nodes.into_iter().enumerate() {
        let node_index = u32::try_from(node_index).unwrap_or(u32::MAX);
        for mut device in draft.devices {
            device.index = u32::try_from(devices.len()).unwrap_or(u32::MAX);
            device.node = node_index;
            devices.push(device);
        }
        node_list.push(Node { index: node_index, gpu_link: draft.gpu_link, host: draft.host });
    }
    HardwareProfile { name, description, devices, nodes: node_list, inter_node_link }
}

/// The GPU-to-GPU link of a node when the file gives none. GPUs of one SXM model (those with
/// NVLink ports in the catalog) sit on an NVLink baseboard: up to 4 GPUs are wired directly, each
/// GPU's links split evenly among its peers (HGX A100 4-GPU: 12 links, 4 to each of 3 peers); more
/// than 4 go through NVSwitch, and every pair gets a GPU's full NVLink bandwidth (HGX H100 8-GPU).
/// Anything else (PCIe cards, mixed models, one GPU) has no GPU link: traffic crosses PCIe.
pub(super) fn default_gpu_link(devices: &[Device]) -> Option<Link> {
    let first = devices.first()?;
    let nvlink = first.nvlink?;
    let peers = u64::try_from(devices.len()).ok()?.checked_sub(1)?;
    if peers == 0 || !devices.iter().all(|d| d.nvlink == Some(nvlink) && d.name == first.name) {
        return None;
    }
    let bandwidth =
        if peers <= 3 { nvlink.bandwidth_bytes_per_s / peers } else { nvlink.bandwidth_bytes_per_s };
    Some(Link {
        kind: LinkKind::Nvlink,
        generation: Some(nvlink.generation),
        bandwidth_bytes_per_s: bandwidth,
    })
}

/// Reads a profile file into a profile. `default_name` names it when the file has no `name`.
pub(super) fn profile_from_yaml(
    text: &str,
    origin: &str,
    default_name: &str,
) -> Result<HardwareProfile, InputError> {
    let file: ProfileFile = schema::parse_yaml(text, origin)?;
    let catalog = catalog::catalog()?;
    let name = match &file.name {
        Some(name) if name.value.trim().is_empty() => {
            return Err(error_at(origin, &name.referenced, "name", "the profile name is empty")
                .with_fix("write a short name, e.g. `name: my-workstation`"));
        }
        Some(name) => name.value.trim().to_string(),
        None => default_name.to_string(),
    };
    let description = file.description.clone().unwrap_or_default().trim().to_string();

    let nodes = match (&file.nodes, &file.devices) {
        (Some(nodes), None) => {
            if file.gpu_link.is_some() || file.host.is_some() {
                return Err(error_at(
                    origin,
                    &nodes.referenced,
                    "nodes",
                    "`gpu_link` and `host` at the top level describe a single node, but `nodes` lists nodes",
                )
                .with_fix("move `gpu_link` and `host` into each entry of `nodes`"));
            }
            if nodes.value.is_empty() {
                return Err(error_at(origin, &nodes.referenced, "nodes", "the list of nodes is empty")
                    .with_fix("list at least one node with its `devices`"));
            }
            let mut drafts = Vec::new();
            for (i, node) in nodes.value.iter().enumerate() {
                let prefix = indexed("", "nodes", i);
                let draft = node_from_entry(origin, catalog, &node.value, &prefix)?;
                let count = count_of(origin, node.value.count.as_ref(), &key_path(&prefix, "count"))?;
                let existing: usize = drafts.iter().map(|n: &NodeDraft| n.devices.len()).sum();
                let added = draft.devices.len().saturating_mul(count as usize);
                if existing.saturating_add(added) > MAX_DEVICES {
                    return Err(too_many_devices(origin, &node.referenced, &prefix));
                }
                for _ in 1..count {
                    drafts.push(NodeDraft {
                        devices: draft.devices.clone(),
                        gpu_link: draft.gpu_link,
                        host: draft.host,
                    });
                }
                drafts.push(draft);
            }
            drafts
        }
        (None, Some(devices)) => {
            let entry = NodeParts { devices, gpu_link: file.gpu_link.as_ref(), host: file.host.as_ref() };
            vec![node_from_parts(origin, catalog, entry, "")?]
        }
        (Some(nodes), Some(_)) => {
            return Err(error_at(
                origin,
                &nodes.referenced,
                "nodes",
                "give either `devices` (one node) or `nodes`, not both",
            )
            .with_fix("for several nodes, move `devices` into an entry of `nodes`"));
        }
        (None, None) => {
            return Err(InputError::new(origin, "the profile lists no devices").at_key("devices").with_fix(
                "add `devices:` with at least one entry such as `- gpu: t4` (see docs/hardware-profiles.md)",
            ));
        }
    };

    let inter_node_link = match &file.inter_node_link {
        Some(link) => Some(link_from_entry(origin, &link.value, "inter_node_link")?),
        None => None,
    };
    if nodes.len() > 1 && inter_node_link.is_none() {
        let location = file.nodes.as_ref().map_or(Location::UNKNOWN, |n| n.referenced);
        return Err(error_at(
            origin,
            &location,
            "nodes",
            format!("{} nodes but no `inter_node_link`", nodes.len()),
        )
        .with_fix(
            "add e.g. `inter_node_link: {kind: infiniband, bandwidth: 50GB/s}` (per GPU pair, per direction)",
        ));
    }
    Ok(assemble(name, description, nodes, inter_node_link))
}

struct NodeParts<'a> {
    devices: &'a Spanned<Vec<Spanned<DeviceEntry>>>,
    gpu_link: Option<&'a Spanned<LinkEntry>>,
    host: Option<&'a HostEntry>,
}

fn node_from_entry(
    origin: &str,
    catalog: &catalog::Catalog,
    node: &NodeEntry,
    prefix: &str,
) -> Result<NodeDraft, InputError> {
    let parts =
        NodeParts { devices: &node.devices, gpu_link: node.gpu_link.as_ref(), host: node.host.as_ref() };
    node_from_parts(origin, catalog, parts, prefix)
}

fn node_from_parts(
    origin: &str,
    catalog: &catalog::Catalog,
    parts: NodeParts<'_>,
    prefix: &str,
) -> Result<NodeDraft, InputError> {
    let devices_key = key_path(prefix, "devices");
    if parts.devices.value.is_empty() {
        return Err(error_at(
            origin,
            &parts.devices.referenced,
            &devices_key,
            "the list of devices is empty",
        )
        .with_fix("list at least one device, e.g. `- gpu: t4`"));
    }
    let mut devices: Vec<Device> = Vec::new();
    for (i, entry) in parts.devices.value.iter().enumerate() {
        let key = indexed(prefix, "devices", i);
        let device = device_from_entry(origin, catalog, entry, &key)?;
        let count = count_of(origin, entry.value.count.as_ref(), &key_path(&key, "count"))?;
        if devices.len().saturating_add(count as usize) > MAX_DEVICES {
            return Err(too_many_devices(origin, &entry.referenced, &key));
        }
        for _ in 0..count {
            devices.push(device.clone());
        }
    }
    let gpu_link = match parts.gpu_link {
        Some(link) => Some(link_from_entry(origin, &link.value, &key_path(prefix, "gpu_link"))?),
        None => default_gpu_link(&devices),
    };
    let host = match parts.host {
        Some(host) => host_from_entry(origin, host, &key_path(prefix, "host"))?,
        None => Host::default(),
    };
    Ok(NodeDraft { devices, gpu_link, host })
}

fn device_from_entry(
    origin: &str,
    catalog: &catalog::Catalog,
    entry: &Spanned<DeviceEntry>,
    key: &str,
) -> Result<Device, InputError> {
    let own = parse_device_entry(origin, &entry.value, key)?;
    let spec = match &entry.value.gpu {
        Some(gpu) => {
            let wanted = gpu.value.trim().to_ascii_lowercase();
            let Some(base) = catalog.gpu(&wanted) else {
                let keys = catalog.gpu_keys();
                let mut err = error_at(
                    origin,
                    &gpu.referenced,
                    &key_path(key, "gpu"),
                    format!("`{}` is not a GPU of the catalog", gpu.value),
                );
                err = match super::suggestions(&wanted, &keys).as_slice() {
                    [] => err.with_fix(format!(
                        "use one of {}, or define the GPU inline (name, memory, compute_capability, memory_bandwidth, pcie)",
                        keys.join(", ")
                    )),
                    close => err.with_fix(format!(
                        "did you mean {}? The catalog has: {}",
                        crate::suggest::ticked_or(close),
                        keys.join(", ")
                    )),
                };
                return Err(err);
            };
            own.over(&base.spec)
        }
        None => own,
    };
    finalize_device(&spec, &catalog.generations, origin, &entry.referenced, key)
}

fn count_of(origin: &str, count: Option<&Spanned<u32>>, key: &str) -> Result<u32, InputError> {
    let Some(count) = count else { return Ok(1) };
    if count.value == 0 || count.value > MAX_COUNT {
        return Err(error_at(
            origin,
            &count.referenced,
            key,
            format!("{} is not a count from 1 to {MAX_COUNT}", count.value),
        )
        .with_fix("write how many identical copies there are, e.g. `count: 8`"));
    }
    Ok(count.value)
}

fn too_many_devices(origin: &str, location: &Location, key: &str) -> InputError {
    error_at(origin, location, key, format!("more than {MAX_DEVICES} devices in one profile"))
        .with_fix("check the counts")
}

fn link_from_entry(origin: &str, link: &LinkEntry, key: &str) -> Result<Link, InputError> {
    let kind = match link.kind.value.trim().to_ascii_lowercase().as_str() {
        "nvlink" => LinkKind::Nvlink,
        "pcie" => LinkKind::Pcie,
        "infiniband" => LinkKind::Infiniband,
        "ethernet" => LinkKind::Ethernet,
        other => {
            return Err(error_at(
                origin,
                &link.kind.referenced,
                &key_path(key, "kind"),
                format!("unknown link kind `{other}`"),
            )
            .with_fix("use nvlink, pcie, infiniband or ethernet"));
        }
    };
    let bandwidth = schema::parse_rate(origin, &link.bandwidth, &key_path(key, "bandwidth"), "50GB/s")?;
    Ok(Link { kind, generation: link.generation.as_ref().map(|g| g.value), bandwidth_bytes_per_s: bandwidth })
}

fn host_from_entry(origin: &str, host: &HostEntry, key: &str) -> Result<Host, InputError> {
    let ram = match &host.ram {
        Some(ram) => Some(schema::parse_size(origin, ram, &key_path(key, "ram"), "512GiB")?),
        None => None,
    };
    let disk = match &host.disk {
        Some(disk) => Some(schema::parse_size(origin, disk, &key_path(key, "disk"), "2TB")?),
        None => None,
    };
    Ok(Host { ram_bytes: ram, disk_bytes: disk })
}
