//! Hardware profiles: being written.

use crate::InputError;

/// A hardware profile.
#[derive(Debug, Clone, PartialEq)]
pub struct HardwareProfile {
    pub name: String,
}

/// Loads a profile from a built-in name, a short form (`2xt4`) or a YAML file.
pub fn load(spec: &str) -> Result<HardwareProfile, InputError> {
    Err(InputError::new(spec, "hardware profiles are not read yet"))
}
