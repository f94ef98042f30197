//! The hardware YAML as written: serde structs for profile files and the GPU catalog, each value
//! kept with its line and column (`serde_saphyr::Spanned`) so that a later check can point at it,
//! and the small parsers for sizes, rates and compute capabilities those values need.

use crate::InputError;
use crate::units::parse_bytes;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_saphyr::{Location, Spanned};
use std::borrow::Cow;
use std::fmt;

/// A profile file (built-in or the user's). One node is written with `devices` (and optionally
/// `gpu_link` and `host`) at the top level; several nodes with `nodes` and `inter_node_link`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProfileFile {
    pub name: Option<Spanned<String>>,
    pub description: Option<String>,
    pub devices: Option<Spanned<Vec<Spanned<DeviceEntry>>>>,
    pub gpu_link: Option<Spanned<LinkEntry>>,
    pub host: Option<HostEntry>,
    pub nodes: Option<Spanned<Vec<Spanned<NodeEntry>>>>,
    pub inter_node_link: Option<Spanned<LinkEntry>>,
}

/// `count` identical nodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeEntry {
    pub count: Option<Spanned<u32>>,
    pub devices: Spanned<Vec<Spanned<DeviceEntry>>>,
    pub gpu_link: Option<Spanned<LinkEntry>>,
    pub host: Option<HostEntry>,
}

/// One device entry: a catalog GPU (`gpu: t4`) with optional overrides, or a GPU defined inline
/// with the same keys. `count` repeats it. The catalog's own entries use the same keys, less
/// `gpu` and `count`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeviceEntry {
    pub gpu: Option<Spanned<String>>,
    pub count: Option<Spanned<u32>>,
    pub name: Option<Spanned<String>>,
    pub memory: Option<Spanned<Scalar>>,
    pub driver_reserve: Option<Spanned<Scalar>>,
    pub driver_reserve_source: Option<String>,
    pub context_reserve: Option<Spanned<Scalar>>,
    pub context_reserve_source: Option<String>,
    pub compute_capability: Option<Spanned<Scalar>>,
    pub bf16: Option<bool>,
    pub fp8: Option<bool>,
    pub memory_bandwidth: Option<Spanned<Scalar>>,
    pub pcie: Option<Spanned<PcieEntry>>,
    pub nvlink: Option<Spanned<NvlinkEntry>>,
}

/// The GPU's host interface.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PcieEntry {
    pub generation: Spanned<u32>,
    pub lanes: Option<Spanned<u32>>,
}

/// The GPU's NVLink ports: generation and the bandwidth of all its links together, per direction.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NvlinkEntry {
    pub generation: Spanned<u32>,
    pub bandwidth: Spanned<Scalar>,
}

/// A link between two devices: `kind` (nvlink, pcie, infiniband, ethernet), optional generation,
/// and the bandwidth available to one device pair, per direction.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LinkEntry {
    pub kind: Spanned<String>,
    pub generation: Option<Spanned<u32>>,
    pub bandwidth: Spanned<Scalar>,
}

/// Host memory and disk of one node, for offload.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HostEntry {
    pub ram: Option<Spanned<Scalar>>,
    pub disk: Option<Spanned<Scalar>>,
}

/// The GPU catalog file (`catalog/hardware/gpus.yaml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CatalogFile {
    pub generations: OrderedMap<Spanned<GenerationEntry>>,
    pub gpus: OrderedMap<Spanned<DeviceEntry>>,
}

/// Defaults shared by the GPUs of one architecture generation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GenerationEntry {
    pub name: String,
    pub compute_capabilities: Vec<Spanned<Scalar>>,
    pub bf16: bool,
    pub fp8: bool,
    pub context_reserve: Spanned<Scalar>,
    pub context_reserve_source: String,
    pub driver_reserve: Spanned<Scalar>,
    pub driver_reserve_source: String,
}

/// A YAML mapping read in file order (serde's maps would sort or hash the keys).
#[derive(Debug)]
pub(super) struct OrderedMap<T>(pub Vec<(Spanned<String>, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OrderedMap<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for MapVisitor<T> {
            type Value = OrderedMap<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    let value = map.next_value::<T>()?;
                    entries.push((key, value));
                }
                Ok(OrderedMap(entries))
            }
        }
        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// A scalar kept as text, whether YAML typed it as a string or a number, so that `16` (a size
/// without unit) reaches our own check and its message instead of a type error.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar such as `15360MiB`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// Parses a profile or catalog file; a syntax or schema error names the origin, line and column.
pub(super) fn parse_yaml<'de, T: Deserialize<'de>>(text: &'de str, origin: &str) -> Result<T, InputError> {
    serde_saphyr::from_str::<T>(text).map_err(|err| {
        InputError::yaml(
            origin,
            &err,
            "hardware profile",
            "see docs/hardware-profiles.md for the schema and an example",
        )
    })
}

/// An error about the value at `location`, whose key path is `key` (`devices[1].memory`).
pub(super) fn error_at(
    origin: &str,
    location: &Location,
    key: &str,
    problem: impl fmt::Display,
) -> InputError {
    let error = InputError::new(origin, format!("`{key}`: {problem}"));
    if location.line() > 0 { error.at_line(location.line(), location.column()) } else { error.at_key(key) }
}

/// A size with a unit (`15360MiB`, `16GB`); `what` names the quantity in the fix.
pub(super) fn parse_size(
    origin: &str,
    value: &Spanned<Scalar>,
    key: &str,
    example: &str,
) -> Result<u64, InputError> {
    let bytes = parse_bytes(&value.value.0).map_err(|problem| {
        error_at(origin, &value.referenced, key, problem).with_fix(format!(
            "write the size with a unit, e.g. `{example}` (MiB/GiB are powers of 2, MB/GB of 10)"
        ))
    })?;
    if bytes > MAX_SIZE {
        return Err(error_at(
            origin,
            &value.referenced,
            key,
            format!(
                "{} is past the bound of 1 PiB (2⁵⁰ bytes) on a size in a hardware profile",
                value.value.0
            ),
        )
        .with_fix(format!("give a size of at most 1PiB, e.g. `{example}` (docs/limits.md)")));
    }
    Ok(bytes)
}

/// The largest memory a profile may give one device or node: 1 PiB (2⁵⁰ bytes). The largest
/// GPU has 192 GB (MI300X, B200) and the largest node some TiB of host memory (docs/limits.md).
const MAX_SIZE: u64 = 1 << 50;

/// A rate per second (`900GB/s`).
pub(super) fn parse_rate(
    origin: &str,
    value: &Spanned<Scalar>,
    key: &str,
    example: &str,
) -> Result<u64, InputError> {
    let text = value.value.0.trim();
    let fix = || format!("write a rate with its unit, e.g. `{example}`");
    let Some(size) = text.strip_suffix("/s") else {
        return Err(error_at(
            origin,
            &value.referenced,
            key,
            format!("expected a rate per second such as `{example}`, found `{text}`"),
        )
        .with_fix(fix()));
    };
    let bytes = parse_bytes(size)
        .map_err(|problem| error_at(origin, &value.referenced, key, problem).with_fix(fix()))?;
    if bytes == 0 {
        return Err(error_at(origin, &value.referenced, key, "a bandwidth cannot be zero").with_fix(fix()));
    }
    Ok(bytes)
}

/// `"8.6"` → (8, 6). YAML may have typed it as a number; a number like `8.10` would have lost its
/// zero, so quoting is recommended in the fix.
pub(super) fn parse_compute_capability(
    origin: &str,
    value: &Spanned<Scalar>,
    key: &str,
) -> Result<(u32, u32), InputError> {
    let text = value.value.0.trim();
    let parsed = text.split_once('.').and_then(|(major, minor)| {
        let major: u32 = major.parse().ok()?;
        let minor: u32 = minor.parse().ok()?;
        (1..=99).contains(&major).then_some((major, minor))
    });
    parsed.ok_or_else(|| {
        error_at(
            origin,
            &value.referenced,
            key,
            format!("expected a compute capability `major.minor`, found `{text}`"),
        )
        .with_fix(
            "write it quoted, as `nvidia-smi --query-gpu=compute_cap --format=csv` prints it, e.g. \"8.6\"",
        )
    })
}

/// Text for messages: a key path joined with an index, `devices[1]`.
pub(super) fn indexed(prefix: &str, name: &str, index: usize) -> String {
    if prefix.is_empty() { format!("{name}[{index}]") } else { format!("{prefix}.{name}[{index}]") }
}

/// `prefix.key`, or `key` at the top level.
pub(super) fn key_path<'a>(prefix: &str, key: &'a str) -> Cow<'a, str> {
    if prefix.is_empty() { Cow::Borrowed(key) } else { Cow::Owned(format!("{prefix}.{key}")) }
}
