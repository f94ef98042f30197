//! A vision-language model's images as the step sees them: how the vision tower's blocks run
//! on the patches (as many attention sequences as the blocks have separate spans), and the
//! tensors the images add outside the blocks: the processor's `pixel_values` (float32 but for
//! Llama 4's bfloat16, one row of `channels × temporal_patch_size × patch_size²` values per patch), held by the caller for
//! the whole step, and the merged image embeddings the model's forward scatters into the input
//! embeddings (`image_embeds`, the language model's width, in the compute dtype), held until
//! that forward returns (`Qwen2_5_VLModel.forward`, transformers 5.24).

use crate::workload::{Finetune, GradCheckpointing, Images, Workload};
use vramplan_profiles::model::vision::{ImageTokens, VisionFacts};
use vramplan_profiles::model::{ModelDescription, StackKind};

/// Whether module `path` is the vision tower or inside it.
pub(crate) fn in_tower(model: &ModelDescription, path: &str) -> bool {
    model.facts.vision.as_ref().is_some_and(|v| {
        path == v.path || path.strip_prefix(v.path.as_str()).is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Whether module `path` is one the step never runs or inside one ([`VisionFacts::idle_paths`]:
/// Phi-4 multimodal's audio embedding), whose norms keep nothing.
pub(crate) fn idle(model: &ModelDescription, path: &str) -> bool {
    model.facts.vision.as_ref().is_some_and(|v| {
        v.idle_paths.iter().any(|idle| {
            path == idle || path.strip_prefix(idle.as_str()).is_some_and(|rest| rest.starts_with('.'))
        })
    })
}

/// Whether a LoRA step runs the tower with autograd although no adapter wraps it: PEFT prepares
/// a model with gradient checkpointing by calling transformers' `enable_input_require_grads`
/// (`PeftModel._prepare_model_for_gradient_checkpointing`; `prepare_model_for_kbit_training`
/// for QLoRA), which hooks the output of every sub-model's `get_input_embeddings()` to require
/// a gradient. Where that is the tower's patch embedding (Qwen2.5-VL, SigLIP), every block
/// after it builds a graph, so a checkpointed block keeps its input until backward; Qwen3-VL's
/// tower has no input embeddings to hook and keeps nothing.
pub(crate) fn input_hooked(model: &ModelDescription, workload: &Workload) -> bool {
    matches!(workload.finetune, Finetune::Lora { .. })
        && workload.grad_checkpointing != GradCheckpointing::Off
        && model.facts.vision.as_ref().is_some_and(|v| v.hooked_input_embeddings)
}

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
    let (vision, image, count) = batch_images(model, batch, Some(images))?;
    let index = model.facts.layers[..layer].iter().filter(|l| l.stack == StackKind::Vision).count() as u64;
    let patches = image.patches;
    if vision.packed_images {
        // Pixtral: every image of the batch in one sequence, under a block-diagonal mask.
        return Some((1, count.saturating_mul(patches)));
    }
    if image.tiles > 1 || vision.class_token {
        // Llama 4: each tile one sequence, its class token after its patches.
        let per_tile = patches / image.tiles.max(1) + u64::from(vision.class_token);
        return Some((count.saturating_mul(image.tiles), per_tile));
    }
    let span = vision.attended_patches(index, patches).max(1);
    let spans_per_image = patches.div_ceil(span);
    Some((count.saturating_mul(spans_per_image), span))
}

/// The tower, what one image of `images` becomes, and the images of `batch` samples; `None` for
/// a step without images, a model without a tower, or an image the processor cannot size.
fn batch_images<'a>(
    model: &'a ModelDescription,
    batch: u64,
    images: Option<&Images>,
) -> Option<(&'a VisionFacts, ImageTokens, u64)> {
    let (images, vision) = (images?, model.facts.vision.as_ref()?);
    let image = vision.image_tokens(images.width, images.height)?;
    Some((vision, image, images.per_sample.saturating_mul(batch)))
}

/// Bytes of the step's `pixel_values` for `batch` samples: one row per patch, in the
/// processor's dtype (float32; Llama 4's bfloat16).
pub(crate) fn pixel_values_bytes(model: &ModelDescription, batch: u64, images: Option<&Images>) -> u64 {
    let Some((vision, image, count)) = batch_images(model, batch, images) else { return 0 };
    vision
        .pixel_value_bytes
        .saturating_mul(image.patches)
        .saturating_mul(vision.patch_values)
        .saturating_mul(count)
}

/// Bytes of the image features the model's forward holds until it returns, for `batch`
/// samples, `compute` bytes a value: the merged image embeddings it scatters into the input
/// embeddings, and Qwen3-VL's DeepStack features, each merger's output (kept in
/// `mm_encoder_outputs`) and its concatenation (`deepstack_visual_embeds`, added after the
/// first language layers) both held until `Qwen3VLModel.forward` returns.
pub(crate) fn image_embeds_bytes(
    model: &ModelDescription,
    batch: u64,
    images: Option<&Images>,
    compute: u64,
) -> u64 {
    let Some((vision, image, count)) = batch_images(model, batch, images) else { return 0 };
    let copies = 1 + 2 * vision.deepstack_blocks.len() as u64;
    compute
        .saturating_mul(model.facts.hidden_size)
        .saturating_mul(image.features)
        .saturating_mul(count)
        .saturating_mul(copies)
}

/// Bytes of a packed tower's block-diagonal attention mask for `batch` samples (Pixtral's
/// `generate_block_attention_mask`: `[1, 1, P, P]` in the compute dtype, `compute` bytes a
/// value, for the `P` patches of every image of the batch), made before the first block and
/// named by the tower's frame until the last returns; 0 for other towers.
pub(crate) fn block_mask_bytes(
    model: &ModelDescription,
    batch: u64,
    images: Option<&Images>,
    compute: u64,
) -> u64 {
    match batch_images(model, batch, images) {
        Some((vision, image, count)) if vision.packed_images => {
            let patches = image.patches.saturating_mul(count);
            patches.saturating_mul(patches).saturating_mul(compute)
        }
        _ => 0,
    }
}
