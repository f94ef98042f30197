//! Short forms typed on the command line: `2xt4` (two catalog GPUs in one node), `rtx4090+rtx3090`
//! (different GPUs side by side, in that order), `2xt4+rtx4090`. Every part names a catalog GPU,
//! optionally prefixed by a count and `x`; all devices share one node, with the default links
//! (NVLink for several GPUs of one SXM model, PCIe otherwise) and no host figures.

use super::resolve::{self, MAX_COUNT, MAX_DEVICES, NodeDraft};
use super::{HardwareProfile, Host, catalog};
use crate::InputError;

/// `Some` when `spec` is written as a short form (a count prefix or a `+`), with the profile or
/// what is wrong with it; `None` when it is not a short form at all.
pub(super) fn parse(spec: &str) -> Option<Result<HardwareProfile, InputError>> {
    let normalized: String = spec
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| if c == '×' { 'x' } else { c })
        .collect::<String>();
    let normalized = normalized.to_ascii_lowercase();
    let parts: Vec<&str> = normalized.split('+').collect();
    let looks_short = parts.len() > 1 || split_count(&normalized).is_some();
    if !looks_short {
        return None;
    }
    Some(build(spec, &normalized, &parts))
}

/// `"2xt4"` → `(2, "t4")`; `None` without a leading count.
fn split_count(part: &str) -> Option<(&str, &str)> {
    let digits = part.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 {
        return None;
    }
    let (count, rest) = part.split_at(digits);
    rest.strip_prefix('x').map(|key| (count, key))
}

fn build(spec: &str, normalized: &str, parts: &[&str]) -> Result<HardwareProfile, InputError> {
    let catalog = catalog::catalog()?;
    let keys = catalog.gpu_keys();
    let mut devices = Vec::new();
    let mut summary = Vec::new();
    for part in parts {
        let (count, key) = match split_count(part) {
            Some((count, key)) => {
                let count: u32 =
                    count.parse().ok().filter(|n| (1..=MAX_COUNT).contains(n)).ok_or_else(|| {
                        InputError::new(spec, format!("`{part}`: the count must be from 1 to {MAX_COUNT}"))
                            .with_fix("write e.g. `2xt4`")
                    })?;
                (count, key)
            }
            None => (1, *part),
        };
        if key.is_empty() {
            return Err(InputError::new(spec, format!("`{part}` names no GPU"))
                .with_fix(format!("write e.g. `2xt4`; GPUs: {}", keys.join(", "))));
        }
        let Some(device) = resolve::catalog_device(key)? else {
            return Err(unknown_part(spec, part, key, &keys));
        };
        summary.push(format!("{count}× {}", device.name));
        if devices.len().saturating_add(count as usize) > MAX_DEVICES {
            return Err(InputError::new(spec, format!("more than {MAX_DEVICES} devices"))
                .with_fix("check the counts"));
        }
        for _ in 0..count {
            devices.push(device.clone());
        }
    }
    let gpu_link = resolve::default_gpu_link(&devices);
    let link_text = match &gpu_link {
        Some(link) => {
            format!("NVLink {} per GPU pair", super::write::format_rate(link.bandwidth_bytes_per_s))
        }
        None if devices.len() > 1 => "GPUs talk over PCIe".to_string(),
        None => "one GPU".to_string(),
    };
    let description = format!("{} in one node (short form; {link_text})", summary.join(" + "));
    let node = NodeDraft { devices, gpu_link, host: Host::default() };
    Ok(resolve::assemble(normalized.to_string(), description, vec![node], None))
}

fn unknown_part(spec: &str, part: &str, key: &str, keys: &[&str]) -> InputError {
    let err = InputError::new(spec, format!("`{key}` in `{part}` is not a GPU of the catalog"));
    // `rtx4090x2` (count after the name) is a common slip: suggest the prefix form.
    if let Some((name, count)) = key.rsplit_once('x')
        && !count.is_empty()
        && count.chars().all(|c| c.is_ascii_digit())
        && keys.contains(&name)
    {
        return err.with_fix(format!("write the count first: `{count}x{name}`"));
    }
    match super::suggestions(key, keys).as_slice() {
        [] => err.with_fix(format!("short forms combine catalog GPUs: {}", keys.join(", "))),
        close => err.with_fix(format!(
            "did you mean {}? GPUs: {}",
            crate::suggest::ticked_or(close),
            keys.join(", ")
        )),
    }
}
