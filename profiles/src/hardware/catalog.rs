//! The built-in hardware data embedded in the binary: the GPU catalog (`catalog/hardware/gpus.yaml`,
//! every GPU model and the per-generation defaults, each defined once) and the built-in profile
//! files (`catalog/hardware/<name>.yaml`), which refer to catalog GPUs by key.

use super::resolve::{self, DeviceSpec};
use super::schema::{self, CatalogFile};
use super::{ComputeCapability, Pcie};
use crate::InputError;
use std::sync::OnceLock;

/// One built-in profile: its name and YAML text.
struct Builtin {
    name: &'static str,
    yaml: &'static str,
}

macro_rules! builtin {
    ($name:literal) => {
        Builtin { name: $name, yaml: include_str!(concat!("../../catalog/hardware/", $name, ".yaml")) }
    };
}

/// Built-in profiles: single GPUs by memory, then multi-GPU machines by total memory.
const BUILTINS: &[Builtin] = &[
    builtin!("t4"),
    builtin!("v100-16gb"),
    builtin!("a10g"),
    builtin!("l4"),
    builtin!("rtx4090"),
    builtin!("rtx3090"),
    builtin!("v100-32gb"),
    builtin!("a100-40gb"),
    builtin!("l40s"),
    builtin!("a100-80gb"),
    builtin!("h100-80gb"),
    builtin!("h200"),
    builtin!("t4x2"),
    builtin!("rtx4090+rtx3090"),
    builtin!("rtx4090-x4"),
    builtin!("v100-32gb-x4"),
    builtin!("a100-40gb-x4"),
    builtin!("l40s-x4"),
    builtin!("a100-80gb-x4"),
    builtin!("h100-80gb-x8"),
    builtin!("h100-80gb-x8-n2"),
    builtin!("h100-80gb-x8-n4"),
];

const GPUS_YAML: &str = include_str!("../../catalog/hardware/gpus.yaml");
const GPUS_ORIGIN: &str = "built-in GPU catalog (catalog/hardware/gpus.yaml)";

/// Names of the built-in profiles, in catalog order.
pub(super) fn builtin_names() -> Vec<&'static str> {
    BUILTINS.iter().map(|b| b.name).collect()
}

/// The YAML text of a built-in profile.
pub(super) fn builtin_yaml(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.name == name).map(|b| b.yaml)
}

/// Defaults shared by one architecture generation.
#[derive(Debug, Clone)]
pub(super) struct Generation {
    pub name: String,
    pub compute_capabilities: Vec<ComputeCapability>,
    pub bf16: bool,
    pub fp8: bool,
    pub context_reserve: u64,
    pub context_reserve_source: String,
    pub driver_reserve: u64,
    pub driver_reserve_source: String,
}

/// A catalog GPU: its key (`a100-80gb`) and its complete description.
#[derive(Debug, Clone)]
pub(super) struct CatalogGpu {
    pub key: String,
    pub spec: DeviceSpec,
}

/// The parsed catalog.
#[derive(Debug)]
pub(super) struct Catalog {
    pub generations: Vec<Generation>,
    pub gpus: Vec<CatalogGpu>,
}

impl Catalog {
    pub fn gpu(&self, key: &str) -> Option<&CatalogGpu> {
        self.gpus.iter().find(|g| g.key == key)
    }

    pub fn gpu_keys(&self) -> Vec<&str> {
        self.gpus.iter().map(|g| g.key.as_str()).collect()
    }
}

/// The catalog, parsed once. A mistake in the embedded file is an error like any other (and the
/// tests load every built-in, so it cannot ship).
pub(super) fn catalog() -> Result<&'static Catalog, InputError> {
    static CATALOG: OnceLock<Result<Catalog, InputError>> = OnceLock::new();
    CATALOG.get_or_init(|| parse_catalog(GPUS_YAML, GPUS_ORIGIN)).as_ref().map_err(Clone::clone)
}

fn parse_catalog(text: &str, origin: &str) -> Result<Catalog, InputError> {
    let file: CatalogFile = schema::parse_yaml(text, origin)?;
    let mut generations = Vec::new();
    for (key, entry) in &file.generations.0 {
        let prefix = format!("generations.{}", key.value);
        let entry_value = &entry.value;
        let mut capabilities = Vec::new();
        for (i, value) in entry_value.compute_capabilities.iter().enumerate() {
            let path = schema::indexed(&prefix, "compute_capabilities", i);
            let (major, minor) = schema::parse_compute_capability(origin, value, &path)?;
            capabilities.push(ComputeCapability { major, minor });
        }
        generations.push(Generation {
            name: entry_value.name.clone(),
            compute_capabilities: capabilities,
            bf16: entry_value.bf16,
            fp8: entry_value.fp8,
            context_reserve: schema::parse_size(
                origin,
                &entry_value.context_reserve,
                &format!("{prefix}.context_reserve"),
                "400MB",
            )?,
            context_reserve_source: entry_value.context_reserve_source.clone(),
            driver_reserve: schema::parse_size(
                origin,
                &entry_value.driver_reserve,
                &format!("{prefix}.driver_reserve"),
                "470MiB",
            )?,
            driver_reserve_source: entry_value.driver_reserve_source.clone(),
        });
    }
    let mut gpus: Vec<CatalogGpu> = Vec::new();
    for (key, entry) in &file.gpus.0 {
        let prefix = format!("gpus.{}", key.value);
        if entry.value.gpu.is_some() || entry.value.count.is_some() {
            return Err(schema::error_at(
                origin,
                &entry.referenced,
                &prefix,
                "a catalog GPU is defined by its own keys; `gpu` and `count` belong in profiles",
            ));
        }
        if gpus.iter().any(|g| g.key == key.value) {
            return Err(schema::error_at(origin, &key.referenced, &prefix, "defined twice"));
        }
        let mut spec = resolve::parse_device_entry(origin, &entry.value, &prefix)?;
        spec.model = Some(key.value.clone());
        // A catalog entry must be complete on its own: resolve it once to check.
        resolve::finalize_device(&spec, &generations, origin, &entry.referenced, &prefix)?;
        gpus.push(CatalogGpu { key: key.value.clone(), spec });
    }
    Ok(Catalog { generations, gpus })
}

/// PCIe bandwidth per direction: lanes × transfer rate × encoding efficiency (PCI-SIG: 2.5 and
/// 5 GT/s with 8b/10b for generations 1–2; 8, 16 and 32 GT/s with 128b/130b for 3–5). `None` for
/// a generation outside 1–5.
pub(super) fn pcie_bandwidth(pcie: Pcie) -> Option<u64> {
    let (mega_transfers, payload, encoded): (u128, u128, u128) = match pcie.generation {
        1 => (2_500, 8, 10),
        2 => (5_000, 8, 10),
        3 => (8_000, 128, 130),
        4 => (16_000, 128, 130),
        5 => (32_000, 128, 130),
        _ => return None,
    };
    // bits/s = MT/s × 10⁶ × lanes × payload/encoded; bytes = bits / 8.
    let bytes = mega_transfers * 1_000_000 * u128::from(pcie.lanes) * payload / (encoded * 8);
    u64::try_from(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_rates_follow_the_pci_sig_figures() {
        // PCI-SIG quotes ~15.75, ~31.5 and ~63 GB/s per direction for x16 links of gen 3, 4, 5.
        let x16 = |generation| pcie_bandwidth(Pcie { generation, lanes: 16 }).unwrap_or(0);
        assert_eq!(x16(3), 15_753_846_153);
        assert_eq!(x16(4), 31_507_692_307);
        assert_eq!(x16(5), 63_015_384_615);
        assert_eq!(pcie_bandwidth(Pcie { generation: 4, lanes: 8 }), Some(15_753_846_153));
        assert_eq!(pcie_bandwidth(Pcie { generation: 7, lanes: 16 }), None);
    }

    #[test]
    fn the_embedded_catalog_parses_and_covers_every_generation_once() {
        let catalog = catalog().expect("the embedded catalog parses");
        let names: Vec<&str> = catalog.generations.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["Volta", "Turing", "Ampere", "Ada", "Hopper"]);
        for gpu in &catalog.gpus {
            let capability = gpu.spec.compute_capability.expect("catalog GPUs have a compute capability");
            let covering =
                catalog.generations.iter().filter(|g| g.compute_capabilities.contains(&capability));
            assert_eq!(covering.count(), 1, "{} is not in exactly one generation", gpu.key);
        }
    }

    #[test]
    fn a_catalog_entry_with_a_missing_key_is_refused_where_it_is() {
        let text = "generations: {}\ngpus:\n  mygpu:\n    name: X\n    memory: 16GiB\n";
        let err = parse_catalog(text, "test.yaml").unwrap_err();
        assert_eq!(err.location, Some(crate::Location::LineColumn { line: 4, column: 5 }));
        assert!(err.problem.contains("gpus.mygpu"), "{err}");
    }
}
