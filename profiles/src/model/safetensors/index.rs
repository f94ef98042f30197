//! `model.safetensors.index.json`: which shard file holds each tensor (`weight_map`) and the
//! checkpoint's total tensor bytes (`metadata.total_size`).

use crate::InputError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A parsed index file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CheckpointIndex {
    /// Tensor name → shard file name (a plain file name in the same folder).
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`: bytes of every tensor at its stored dtype.
    pub total_size: Option<u64>,
}

/// Reads and checks an index file.
pub(crate) fn read_index(path: &Path) -> Result<CheckpointIndex, InputError> {
    let text = crate::files::read_text(path, crate::files::FileKind::ModelJson)?;
    parse_index(&text, &path.display().to_string())
}

pub(crate) fn parse_index(text: &str, origin: &str) -> Result<CheckpointIndex, InputError> {
    const FIX: &str = "the index is one JSON object, as transformers' `save_pretrained` writes it: \
                       correct the file, or download it again";
    let value: Value = serde_json::from_str(text).map_err(|e| InputError::json(origin, &e).with_fix(FIX))?;
    let Value::Object(object) = value else {
        return Err(
            InputError::new(origin, "expected a JSON object with `weight_map` and `metadata`").with_fix(FIX)
        );
    };
    let Some(Value::Object(map)) = object.get("weight_map") else {
        return Err(InputError::new(
            origin,
            "missing `weight_map`: expected an object of tensor name → file",
        )
        .at_key("weight_map")
        .with_fix("a safetensors index maps every tensor name to the shard file that holds it"));
    };
    let mut weight_map = BTreeMap::new();
    for (name, file) in map {
        let key = || format!("weight_map.{name}");
        let Value::String(file) = file else {
            return Err(InputError::new(origin, "expected a shard file name (a string)")
                .at_key(key())
                .with_fix(FIX));
        };
        let plain = Path::new(file).file_name().is_some_and(|f| f == file.as_str()) && file != "..";
        if !plain {
            return Err(InputError::new(origin, format!("`{file}` is not a plain file name"))
                .at_key(key())
                .with_fix("shard files must lie next to the index: name them without folders"));
        }
        weight_map.insert(name.clone(), file.clone());
    }
    let total_size = match object.get("metadata").and_then(|m| m.get("total_size")) {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => Some(v),
            None => match n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0) {
                Some(f) => Some(f as u64),
                None => {
                    return Err(InputError::new(origin, format!("expected a byte count, found `{n}`"))
                        .at_key("metadata.total_size")
                        .with_fix(FIX));
                }
            },
        },
        Some(_) => {
            return Err(InputError::new(origin, "expected a byte count (an integer)")
                .at_key("metadata.total_size")
                .with_fix(FIX));
        }
    };
    Ok(CheckpointIndex { weight_map, total_size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_be_plain() {
        let e = parse_index(r#"{"weight_map": {"a.weight": "../x.safetensors"}}"#, "i.json").unwrap_err();
        assert!(e.to_string().contains("not a plain file name"), "{e}");
        let ok = parse_index(r#"{"metadata": {"total_size": 8}, "weight_map": {"a": "m.safetensors"}}"#, "i")
            .unwrap();
        assert_eq!(ok.total_size, Some(8));
    }
}
