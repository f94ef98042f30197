//! Prices per GPU-hour, for `vramplan whatif cheapest`: the built-in table
//! (`catalog/hardware/prices.yaml`, every figure with its published source) or a user's file of
//! the same shape, keyed by the GPU catalog's keys (`t4`, `a100-80gb`).

use super::HardwareProfile;
use super::catalog::catalog;
use super::schema::parse_yaml;
use crate::InputError;
use crate::suggest::ticked_or;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

const PRICES_YAML: &str = include_str!("../../catalog/hardware/prices.yaml");
const PRICES_ORIGIN: &str = "built-in price table (catalog/hardware/prices.yaml)";

/// Dollars (or the file's currency) per GPU-hour, by catalog GPU key.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    /// The currency the figures are in (`USD`).
    pub currency: String,
    per_gpu_hour: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PricesFile {
    currency: String,
    prices: BTreeMap<String, PriceEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceEntry {
    per_gpu_hour: f64,
    #[serde(default)]
    #[allow(dead_code)] // Read so that files keep their sources; never printed.
    source: Option<String>,
}

impl Prices {
    /// The built-in table.
    pub fn builtin() -> Result<Prices, InputError> {
        parse(PRICES_YAML, PRICES_ORIGIN)
    }

    /// A user's table (`--prices FILE`), the built-in's shape: `currency` and `prices: {key:
    /// {per_gpu_hour: N}}`.
    pub fn from_file(path: &Path) -> Result<Prices, InputError> {
        let origin = path.display().to_string();
        let text = crate::files::read_text(path, crate::files::FileKind::Prices).map_err(|e| {
            e.with_fix("give the path of a YAML file shaped like catalog/hardware/prices.yaml")
        })?;
        parse(&text, &origin)
    }

    /// The price of one GPU of catalog kind `key`.
    pub fn per_gpu_hour(&self, key: &str) -> Option<f64> {
        self.per_gpu_hour.get(key).copied()
    }

    /// The price of every GPU of `hardware` together; `None` when one has no price (or is not a
    /// catalog kind).
    pub fn per_hour(&self, hardware: &HardwareProfile) -> Option<f64> {
        hardware.devices.iter().map(|d| d.model.as_deref().and_then(|k| self.per_gpu_hour(k))).sum()
    }
}

fn parse(text: &str, origin: &str) -> Result<Prices, InputError> {
    let file: PricesFile = parse_yaml(text, origin)?;
    let known = catalog()?;
    for (key, entry) in &file.prices {
        if known.gpu(key).is_none() {
            let keys: Vec<&str> = known.gpus.iter().map(|g| g.key.as_str()).collect();
            return Err(InputError::new(origin, format!("`{key}` is not a GPU of the catalog"))
                .at_key(format!("prices.{key}"))
                .with_fix(format!("use one of {}", ticked_or(&keys))));
        }
        if !(entry.per_gpu_hour.is_finite() && entry.per_gpu_hour >= 0.0) {
            return Err(InputError::new(origin, format!("price {} per GPU-hour", entry.per_gpu_hour))
                .at_key(format!("prices.{key}.per_gpu_hour"))
                .with_fix("give a price of 0 or more"));
        }
    }
    let per_gpu_hour = file.prices.into_iter().map(|(k, e)| (k, e.per_gpu_hour)).collect();
    Ok(Prices { currency: file.currency, per_gpu_hour })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_gpu_has_a_built_in_price() {
        let prices = Prices::builtin().unwrap();
        for gpu in &catalog().unwrap().gpus {
            assert!(prices.per_gpu_hour(&gpu.key).is_some(), "{} has no price", gpu.key);
        }
        let t4x2 = super::super::load("t4x2").unwrap();
        assert_eq!(prices.per_hour(&t4x2), Some(2.0 * prices.per_gpu_hour("t4").unwrap()));
    }

    #[test]
    fn unknown_keys_and_negative_prices_are_refused() {
        let err = parse("currency: USD\nprices:\n  t5: {per_gpu_hour: 1}\n", "p.yaml").unwrap_err();
        assert!(err.to_string().contains("`t5` is not a GPU"), "{err}");
        let err = parse("currency: USD\nprices:\n  t4: {per_gpu_hour: -1}\n", "p.yaml").unwrap_err();
        assert!(err.to_string().contains("prices.t4.per_gpu_hour"), "{err}");
    }
}
