//! Built-in models: published `config.json` files embedded in the binary, by short name.

/// One built-in model.
struct Entry {
    name: &'static str,
    config: &'static str,
}

macro_rules! entry {
    ($name:literal) => {
        Entry { name: $name, config: include_str!(concat!("../../catalog/models/", $name, ".json")) }
    };
}

const MODELS: &[Entry] = &[entry!("pythia-2.8b")];

/// The embedded `config.json` of a built-in model.
pub fn builtin_config(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|e| e.name == name).map(|e| e.config)
}

/// Names of the built-in models, in catalog order.
pub fn builtin_names() -> Vec<&'static str> {
    MODELS.iter().map(|e| e.name).collect()
}
