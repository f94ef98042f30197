//! The one reading of a `config.json`'s `quantization_config`: every key a method's config class
//! reads (transformers' `utils/quantization_config.py`, vLLM's `QuantizationConfig.from_config`
//! of each method), checked, with transformers' defaults for absent keys. A value of the wrong
//! kind is an [`InputError`] at `quantization_config.KEY` saying what was expected.

use super::{CtGroup, CtStrategy, Method, Quantization};
use crate::model::Naming;
use crate::model::hf::describe_value as describe;
use crate::{DType, InputError};
use serde_json::{Map, Value};

/// The object under `quantization_config`, with the origin its errors name.
struct Reader<'a> {
    origin: &'a str,
    object: &'a Map<String, Value>,
    /// The key path of `object` (`quantization_config`, `quantization_config.config_groups.group_0`).
    at: String,
}

impl<'a> Reader<'a> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.at)
    }

    fn bad(&self, key: &str, expected: &str, found: &Value, fix: &str) -> InputError {
        InputError::new(self.origin, format!("expected {expected}, found {}", describe(found)))
            .at_key(self.key(key))
            .with_fix(fix.to_string())
    }

    /// The value of `key`, `None` when absent or null.
    fn value(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>, InputError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.to_ascii_lowercase())),
            Some(other) => Err(self.bad(key, "a string", other, "give the value the quantizer wrote")),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, InputError> {
        match self.value(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.bad(key, "true or false", other, "give `true` or `false`")),
        }
    }

    /// An integer, `None` when absent or null.
    fn integer(&self, key: &str) -> Result<Option<i64>, InputError> {
        match self.value(key) {
            None => Ok(None),
            Some(v @ Value::Number(n)) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                None => Err(self.bad(key, "an integer", v, "give a whole number")),
            },
            Some(other) => Err(self.bad(key, "an integer", other, "give a whole number")),
        }
    }

    /// `bits` (or its alias) in `allowed`, `default` when absent.
    fn bits(&self, keys: &[&str], allowed: &[u32], default: Option<u32>) -> Result<u32, InputError> {
        let key = keys.iter().copied().find(|k| self.value(k).is_some()).unwrap_or(keys[0]);
        let listed = allowed.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        match (self.integer(key)?, default) {
            (None, Some(bits)) => Ok(bits),
            (None, None) => {
                Err(InputError::new(self.origin, format!("missing `{key}`: expected one of {listed}"))
                    .at_key(self.key(key))
                    .with_fix(format!("add `\"{key}\": 4` (the bits per quantized weight)")))
            }
            (Some(b), _) if b > 0 && allowed.contains(&(b as u32)) => Ok(b as u32),
            (Some(_), _) => Err(self.bad(
                key,
                &format!("one of {listed}"),
                &self.object[key],
                "give the bits the checkpoint was quantized to",
            )),
        }
    }

    /// A group size: a positive integer, or −1 (one group per row) read as `None`.
    fn group_size(&self, keys: &[&str], default: Option<u64>) -> Result<Option<u64>, InputError> {
        let key = keys.iter().copied().find(|k| self.value(k).is_some()).unwrap_or(keys[0]);
        match self.integer(key)? {
            None => Ok(default),
            Some(-1) => Ok(None),
            Some(g) if g > 0 => Ok(Some(g as u64)),
            Some(_) => Err(self.bad(
                key,
                "a positive group size or -1 (one group per row)",
                &self.object[key],
                "give the group size the checkpoint was quantized with, e.g. 128",
            )),
        }
    }

    /// A list of module names or patterns, `None` when absent or null.
    fn names(&self, key: &str) -> Result<Option<Vec<String>>, InputError> {
        let Some(value) = self.value(key) else { return Ok(None) };
        let fix = "give a list of module names, e.g. [\"lm_head\"]";
        let Value::Array(items) = value else {
            return Err(self.bad(key, "a list of module names", value, fix));
        };
        let mut names: Vec<String> = Vec::with_capacity(items.len());
        for item in items {
            match item.as_str() {
                Some(name) if !names.iter().any(|n| n == name) => names.push(name.to_string()),
                Some(_) => {}
                None => return Err(self.bad(key, "a list of module names", item, fix)),
            }
        }
        Ok(Some(names))
    }

    fn object(&self, key: &str) -> Result<Option<Reader<'a>>, InputError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Object(object)) => {
                Ok(Some(Reader { origin: self.origin, object, at: self.key(key) }))
            }
            Some(other) => Err(self.bad(key, "an object", other, "give it as the quantizer wrote it")),
        }
    }
}

/// Reads `quantization_config` from `config` (`None` when absent or null). `naming` picks the
/// transformers version whose reading of fp8 keys applies (5.x also reads `ignored_layers`).
pub(crate) fn read(
    origin: &str,
    config: &Map<String, Value>,
    naming: Naming,
) -> Result<Option<Quantization>, InputError> {
    let Some(value) = config.get("quantization_config").filter(|v| !v.is_null()) else { return Ok(None) };
    let Value::Object(object) = value else {
        return Err(InputError::new(
            origin,
            format!("expected an object of quantization settings, found {}", describe(value)),
        )
        .at_key("quantization_config")
        .with_fix("remove `quantization_config` or give it as transformers writes it"));
    };
    let r = Reader { origin, object, at: "quantization_config".into() };
    let method = match r.string("quant_method")? {
        Some(method) => method,
        // transformers' `AutoQuantizationConfig.from_dict`: old bitsandbytes configs have no
        // `quant_method`, only `load_in_4bit` / `load_in_8bit`.
        None if r.boolean("load_in_4bit", false)? || r.boolean("load_in_8bit", false)? => {
            "bitsandbytes".into()
        }
        None => {
            return Err(InputError::new(origin, "missing `quant_method`: expected the quantization method")
                .at_key("quantization_config.quant_method")
                .with_fix(
                    "add the method the checkpoint was quantized with (\"fp8\", \"mxfp4\", \"gptq\", \"awq\", \
                     \"bitsandbytes\", \"compressed-tensors\")",
                ));
        }
    };
    Ok(Some(match method.as_str() {
        "fp8" => fp8(&r, naming)?,
        "mxfp4" => Quantization {
            method: Method::Mxfp4 { dequantize: r.boolean("dequantize", false)? },
            skip: r.names("modules_to_not_convert")?,
        },
        "gptq" => Quantization {
            method: Method::Gptq {
                bits: r.bits(&["bits"], &[2, 3, 4, 8], None)?,
                group_size: r.group_size(&["group_size"], Some(128))?,
                sym: r.boolean("sym", true)?,
                desc_act: r.boolean("desc_act", false)?,
            },
            skip: None,
        },
        "awq" => Quantization {
            method: Method::Awq {
                bits: r.bits(&["bits", "w_bit"], &[4], Some(4))?,
                group_size: r.group_size(&["group_size", "q_group_size"], Some(128))?,
                zero_point: r.boolean("zero_point", true)?,
            },
            skip: r.names("modules_to_not_convert")?,
        },
        "bitsandbytes" | "bitsandbytes_4bit" | "bitsandbytes_8bit" => bitsandbytes(&r, &method)?,
        "compressed-tensors" | "compressed_tensors" => compressed_tensors(&r)?,
        other => Quantization { method: Method::Other { name: other.to_string() }, skip: None },
    }))
}

fn fp8(r: &Reader, naming: Naming) -> Result<Quantization, InputError> {
    let fix = "give the value transformers writes for fine-grained FP8 (e.g. [128, 128])";
    // `FineGrainedFP8Config(weight_block_size=(128, 128))`: absent means 128×128 blocks, null
    // one scale per tensor.
    let block = match r.object.get("weight_block_size") {
        None => Some([128, 128]),
        Some(Value::Null) => None,
        Some(value @ Value::Array(items)) => {
            let sizes: Vec<u64> = items.iter().filter_map(Value::as_u64).filter(|v| *v > 0).collect();
            match sizes.as_slice() {
                [rows, cols] if items.len() == 2 => Some([*rows, *cols]),
                _ => return Err(r.bad("weight_block_size", "two positive integers", value, fix)),
            }
        }
        Some(other) => return Err(r.bad("weight_block_size", "a list of two positive integers", other, fix)),
    };
    let static_activations = match r.string("activation_scheme")?.as_deref() {
        None | Some("dynamic") => false,
        Some("static") => true,
        Some(_) => {
            return Err(r.bad(
                "activation_scheme",
                "\"dynamic\" or \"static\"",
                &r.object["activation_scheme"],
                fix,
            ));
        }
    };
    let e8m0_scales = match r.string("scale_fmt")?.as_deref() {
        None | Some("float") => false,
        Some("ue8m0") => true,
        Some(_) => return Err(r.bad("scale_fmt", "\"float\" or \"ue8m0\"", &r.object["scale_fmt"], fix)),
    };
    let weight_dtype = match r.string("fmt")?.as_deref() {
        None | Some("e4m3") => DType::F8E4M3,
        Some("e5m2") => DType::F8E5M2,
        Some(_) => return Err(r.bad("fmt", "\"e4m3\" or \"e5m2\"", &r.object["fmt"], fix)),
    };
    // 5.x also reads vLLM's `ignored_layers`; the first present and not null is the list.
    let mut keys = vec!["modules_to_not_convert"];
    if naming == Naming::V5 {
        keys.push("ignored_layers");
    }
    let mut skip = None;
    for key in keys {
        if let Some(names) = r.names(key)? {
            skip = Some(names);
            break;
        }
    }
    Ok(Quantization { method: Method::Fp8 { block, weight_dtype, e8m0_scales, static_activations }, skip })
}

fn bitsandbytes(r: &Reader, method: &str) -> Result<Quantization, InputError> {
    let four = r.boolean("load_in_4bit", method == "bitsandbytes_4bit")?;
    let eight = r.boolean("load_in_8bit", method == "bitsandbytes_8bit")?;
    let skip = r.names("llm_int8_skip_modules")?;
    if four == eight {
        let problem = if four {
            "`load_in_4bit` and `load_in_8bit` are both true"
        } else {
            "neither `load_in_4bit` nor `load_in_8bit` is true"
        };
        return Err(InputError::new(
            r.origin,
            format!("{problem}: a bitsandbytes checkpoint is one or the other"),
        )
        .at_key("quantization_config.load_in_4bit")
        .with_fix(
            "set exactly one of `load_in_4bit` and `load_in_8bit` to true, as the checkpoint was saved",
        ));
    }
    if eight {
        return Ok(Quantization { method: Method::Bitsandbytes8, skip });
    }
    // `BitsAndBytesConfig` defaults: fp4, no double quantization, uint8 storage.
    let nf4 = match r.string("bnb_4bit_quant_type")?.as_deref() {
        None | Some("fp4") => false,
        Some("nf4") => true,
        Some(_) => {
            return Err(r.bad(
                "bnb_4bit_quant_type",
                "\"nf4\" or \"fp4\"",
                &r.object["bnb_4bit_quant_type"],
                "give \"nf4\" or \"fp4\"",
            ));
        }
    };
    let storage = match r.string("bnb_4bit_quant_storage")? {
        None => DType::U8,
        Some(name) => match DType::parse(&name) {
            Some(dtype) if dtype.bits() >= 8 => dtype,
            _ => {
                return Err(r.bad(
                    "bnb_4bit_quant_storage",
                    "a torch dtype of 8 bits or more",
                    &r.object["bnb_4bit_quant_storage"],
                    "give \"uint8\" (the default) or the storage dtype the checkpoint used",
                ));
            }
        },
    };
    Ok(Quantization {
        method: Method::Bitsandbytes4 {
            nf4,
            double_quant: r.boolean("bnb_4bit_use_double_quant", false)?,
            storage,
        },
        skip,
    })
}

fn compressed_tensors(r: &Reader) -> Result<Quantization, InputError> {
    let format = r.string("format")?.unwrap_or_else(|| "dense".into());
    let Some(groups) = r.object("config_groups")? else {
        return Err(InputError::new(r.origin, "missing `config_groups`: expected the quantization schemes")
            .at_key("quantization_config.config_groups")
            .with_fix(
                "give the `config_groups` llm-compressor wrote (targets, weights: num_bits, type, strategy)",
            ));
    };
    let mut schemes = Vec::new();
    for name in groups.object.keys() {
        let Some(group) = groups.object(name)? else { continue };
        let targets = group.names("targets")?.unwrap_or_else(|| vec!["Linear".into()]);
        let Some(weights) = group.object("weights")? else { continue };
        let bits = weights.bits(&["num_bits"], &[2, 3, 4, 8, 16], None)?;
        let float = match weights.string("type")?.as_deref() {
            None | Some("int") => false,
            Some("float") => true,
            Some(_) => {
                return Err(weights.bad(
                    "type",
                    "\"int\" or \"float\"",
                    &weights.object["type"],
                    "give \"int\" or \"float\"",
                ));
            }
        };
        let strategy = match weights.string("strategy")?.as_deref() {
            None | Some("tensor") => CtStrategy::Tensor,
            Some("channel") => CtStrategy::Channel,
            Some("group" | "tensor_group") => match weights.group_size(&["group_size"], None)? {
                Some(size) => CtStrategy::Group(size),
                None => {
                    return Err(InputError::new(
                        r.origin,
                        "a \"group\" strategy needs a positive `group_size`",
                    )
                    .at_key(weights.key("group_size"))
                    .with_fix("give the group size, e.g. 128"));
                }
            },
            Some("block") => {
                let value = weights.value("block_structure");
                let sizes: Vec<u64> = match value {
                    Some(Value::Array(items)) => {
                        items.iter().filter_map(Value::as_u64).filter(|v| *v > 0).collect()
                    }
                    _ => Vec::new(),
                };
                match sizes.as_slice() {
                    [rows, cols] => CtStrategy::Block([*rows, *cols]),
                    _ => {
                        return Err(InputError::new(
                            r.origin,
                            "a \"block\" strategy needs `block_structure` [rows, cols]",
                        )
                        .at_key(weights.key("block_structure"))
                        .with_fix("give the block shape, e.g. [128, 128]"));
                    }
                }
            }
            Some(_) => {
                return Err(weights.bad(
                    "strategy",
                    "\"tensor\", \"channel\", \"group\" or \"block\"",
                    &weights.object["strategy"],
                    "give the strategy llm-compressor wrote",
                ));
            }
        };
        let static_input = match group.object("input_activations")? {
            Some(input) => !input.boolean("dynamic", false)?,
            None => false,
        };
        schemes.push(CtGroup {
            targets,
            bits,
            float,
            strategy,
            symmetric: weights.boolean("symmetric", true)?,
            static_input,
        });
    }
    Ok(Quantization {
        method: Method::CompressedTensors { format, groups: schemes },
        skip: r.names("ignore")?,
    })
}
