//! Importer for this family: being written.

use super::HfConfig;
use crate::InputError;
use crate::model::{ImportOptions, ModelDescription};

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    _options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    Err(InputError::new(config.origin(), format!("`{arch}` is not built yet")))
}
