//! A vision-language model's images as the step sees them: how the vision tower's blocks run
//! on the patches (as many attention sequences as the blocks have separate spans), and the
//! tensors the images add outside the blocks: the processor's `pixel_values` (float32, one row
//! of `channels × temporal_patch_size × patch_size²` values per patch), held by the caller for
//! the whole step, and the merged image embeddings the model's forward scatters into the input
//! embeddings (`image_embeds`, the language model's width, in the compute dtype), held until
//! that forward returns (`Qwen2_5_VLModel.forward`, transformers 5.24).

use crate::workload::Images;
use vramplan_profiles::model::{ModelDescription, StackKind};

/// How vision block `layer` runs for `batch` samples of `images` each: the number of attention
/// sequences and their length. transformers attends within each image (full-attention blocks)
/// or each window of `attended_patches` (the others), splitting q, k and v at the
/// `cu_seqlens` of the images or the windows and attending within each.
pub(crate) fn sequences(
    model: &ModelDescription,
    layer: usize,
    batch: u64,
    images: &Images,
) -> Option<(u64, u64)> {
    let vision = model.facts.vision.as_ref()?;
    let index = model.facts.layers[..layer].iter().filter(|l| l.stack == StackKind::Vision).count() as u64;
    let patches = vision.image_tokens(images.width, images.height)?.patches;
    let span = vision.attended_patches(index, patches).max(1);
    let spans_per_image = patches.div_ceil(span);
    Some((batch.saturating_mul(images.per_sample).saturating_mul(spans_per_image), span))
}

/// Bytes of the step's `pixel_values` for `batch` samples: float32, one row per patch.
pub(crate) fn pixel_values_bytes(model: &ModelDescription, batch: u64, images: Option<&Images>) -> u64 {
    let (Some(images), Some(vision)) = (images, &model.facts.vision) else { return 0 };
    let Some(image) = vision.image_tokens(images.width, images.height) else { return 0 };
    4u64.saturating_mul(image.patches)
        .saturating_mul(vision.patch_values)
        .saturating_mul(images.per_sample)
        .saturating_mul(batch)
}

/// Bytes of the merged image embeddings for `batch` samples, `compute` bytes a value.
pub(crate) fn image_embeds_bytes(
    model: &ModelDescription,
    batch: u64,
    images: Option<&Images>,
    compute: u64,
) -> u64 {
    let (Some(images), Some(vision)) = (images, &model.facts.vision) else { return 0 };
    let Some(image) = vision.image_tokens(images.width, images.height) else { return 0 };
    compute
        .saturating_mul(model.facts.hidden_size)
        .saturating_mul(image.tokens)
        .saturating_mul(images.per_sample)
        .saturating_mul(batch)
}
