//! A vision-language model's vision tower, as far as memory is concerned: its sizes, which of
//! its blocks attend within windows, and how its image processor turns an image into patches
//! (the tower's tokens) and merged tokens (the language model's image tokens).
//!
//! The processor is transformers' `Qwen2VLImageProcessor` (Qwen2-VL, Qwen2.5-VL; Qwen3-VL uses
//! the same rule with 16-pixel patches): `smart_resize` rounds each side to a multiple of
//! `patch_size × merge_size` and scales the image into `[min_pixels, max_pixels]`, keeping its
//! aspect ratio; an image is one temporal patch (it is repeated `temporal_patch_size` times),
//! so it gives `(h / patch) × (w / patch)` patches and a quarter as many tokens for a merge of 2.

use crate::InputError;
use serde::Serialize;
use serde_json::Value;

/// The file beside `config.json` that holds the image processor's settings.
pub const PREPROCESSOR_FILE: &str = "preprocessor_config.json";

/// The vision tower of a vision-language model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VisionFacts {
    /// The tower's module path (`model.visual`).
    pub path: String,
    /// Width of the tower's blocks (`vision_config.hidden_size`).
    pub hidden_size: u64,
    /// Attention heads per block (`vision_config.num_heads`).
    pub num_heads: u64,
    /// The MLP's width (`vision_config.intermediate_size`).
    pub intermediate_size: u64,
    /// The MLP is gated (SwiGLU: Qwen2.5-VL) rather than two projections (Qwen2-VL, Qwen3-VL).
    pub gated_mlp: bool,
    /// The MLP's activation function, as the config names it.
    pub activation: String,
    /// Side of a square patch in pixels (`patch_size`).
    pub patch_size: u64,
    /// Patches merged into one language-model token along each side (`spatial_merge_size`).
    pub merge_size: u64,
    /// Frames in one temporal patch (`temporal_patch_size`); an image is repeated to fill it.
    pub temporal_patch_size: u64,
    /// Values of one patch in the processor's `pixel_values` (`channels × temporal_patch_size ×
    /// patch_size²`, the patch embedding's input width).
    pub patch_values: u64,
    /// Windowed blocks attend within squares of this many pixels (`window_size`); `None` when
    /// every block attends over the whole image.
    pub window_pixels: Option<u64>,
    /// Indexes of the blocks that attend over the whole image (`fullatt_block_indexes`).
    pub full_attention_blocks: Vec<u64>,
    /// The fewest pixels the processor scales an image up to (`min_pixels`, its
    /// `size.shortest_edge`).
    pub min_pixels: u64,
    /// The most pixels the processor scales an image down to (`max_pixels`, its
    /// `size.longest_edge`).
    pub max_pixels: u64,
}

/// What one image becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ImageTokens {
    /// Height and width after the processor's resize, in pixels.
    pub resized: (u64, u64),
    /// Patches the tower's blocks run on (`grid_t × grid_h × grid_w`).
    pub patches: u64,
    /// Tokens the merger hands the language model (`patches / merge²`): the image's
    /// `<|image_pad|>` tokens in the prompt.
    pub tokens: u64,
}

/// Python's `round` (half to even), as `smart_resize` uses it, of `numerator / denominator`.
fn round_half_even(numerator: u64, denominator: u64) -> u64 {
    let (quotient, remainder) = (numerator / denominator, numerator % denominator);
    match (2 * remainder).cmp(&denominator) {
        std::cmp::Ordering::Less => quotient,
        std::cmp::Ordering::Greater => quotient + 1,
        std::cmp::Ordering::Equal => quotient + quotient % 2,
    }
}

impl VisionFacts {
    /// Reads the pixel bounds of the model's `preprocessor_config.json` (`text`, from
    /// `origin`): `min_pixels` / `max_pixels` as the published files give them, or `size.
    /// shortest_edge` / `size.longest_edge` as transformers 5.x saves them (which the processor
    /// reads the same way, `Qwen2VLImageProcessor.__init__`); absent keys keep the class defaults.
    pub fn read_processor_config(&mut self, text: &str, origin: &str) -> Result<(), InputError> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            InputError::new(origin, format!("not valid JSON: {e}"))
                .with_fix("give the model's preprocessor_config.json as published")
        })?;
        let read = |keys: &[&[&str]]| -> Result<Option<u64>, InputError> {
            for path in keys {
                let found = path.iter().try_fold(&value, |v, k| v.get(k));
                if let Some(found) = found {
                    return match found.as_u64().filter(|&n| n > 0 && n <= 1 << 40) {
                        Some(n) => Ok(Some(n)),
                        None => Err(InputError::new(
                            origin,
                            format!("`{}` is {found}, not a pixel count", path.join(".")),
                        )
                        .at_key(path.join("."))
                        .with_fix("give a positive whole number of pixels")),
                    };
                }
            }
            Ok(None)
        };
        if let Some(min) = read(&[&["min_pixels"], &["size", "shortest_edge"]])? {
            self.min_pixels = min;
        }
        if let Some(max) = read(&[&["max_pixels"], &["size", "longest_edge"]])? {
            self.max_pixels = max;
        }
        if self.min_pixels > self.max_pixels {
            return Err(InputError::new(
                origin,
                format!("min_pixels {} is more than max_pixels {}", self.min_pixels, self.max_pixels),
            )
            .with_fix("give the model's preprocessor_config.json as published"));
        }
        Ok(())
    }

    /// The processor's resize of a `width × height` image (`smart_resize`) and the patches and
    /// tokens it gives. Refuses (`None`) an image whose sides differ by more than 200 times, as
    /// the processor does.
    pub fn image_tokens(&self, width: u64, height: u64) -> Option<ImageTokens> {
        let (w, h) = (width.max(1), height.max(1));
        if w.max(h) > 200 * w.min(h) {
            return None;
        }
        let factor = self.patch_size * self.merge_size;
        let (mut h_bar, mut w_bar) =
            (round_half_even(h, factor) * factor, round_half_even(w, factor) * factor);
        let (hf, wf, ff) = (h as f64, w as f64, factor as f64);
        if h_bar * w_bar > self.max_pixels {
            let beta = (hf * wf / self.max_pixels as f64).sqrt();
            h_bar = factor.max((hf / beta / ff).floor() as u64 * factor);
            w_bar = factor.max((wf / beta / ff).floor() as u64 * factor);
        } else if h_bar * w_bar < self.min_pixels {
            let beta = (self.min_pixels as f64 / (hf * wf)).sqrt();
            h_bar = (hf * beta / ff).ceil() as u64 * factor;
            w_bar = (wf * beta / ff).ceil() as u64 * factor;
        }
        let patches = (h_bar / self.patch_size) * (w_bar / self.patch_size);
        Some(ImageTokens {
            resized: (h_bar, w_bar),
            patches,
            tokens: patches / (self.merge_size * self.merge_size),
        })
    }

    /// Head width of the tower's attention.
    pub fn head_dim(&self) -> u64 {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Patches in one attention window of block `index` for an image of `patches` patches:
    /// the window's (`window_size / patch_size`)² patches, or the whole image for a
    /// full-attention block.
    pub fn attended_patches(&self, index: u64, patches: u64) -> u64 {
        match self.window_pixels {
            Some(window) if !self.full_attention_blocks.contains(&index) => {
                let side = (window / self.patch_size.max(1)).max(1);
                (side * side).min(patches)
            }
            _ => patches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen25() -> VisionFacts {
        VisionFacts {
            path: "model.visual".into(),
            hidden_size: 1280,
            num_heads: 16,
            intermediate_size: 3420,
            gated_mlp: true,
            activation: "silu".into(),
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            patch_values: 3 * 2 * 14 * 14,
            window_pixels: Some(112),
            full_attention_blocks: vec![7, 15, 23, 31],
            min_pixels: 3136,
            max_pixels: 12_845_056,
        }
    }

    #[test]
    fn processor_bounds_from_either_spelling() {
        let mut facts = VisionFacts { max_pixels: 1, min_pixels: 1, ..qwen25() };
        facts.read_processor_config(r#"{"min_pixels": 3136, "max_pixels": 12845056}"#, "p").expect("reads");
        assert_eq!((facts.min_pixels, facts.max_pixels), (3136, 12_845_056));
        facts
            .read_processor_config(r#"{"size": {"shortest_edge": 10, "longest_edge": 20}}"#, "p")
            .expect("reads");
        assert_eq!((facts.min_pixels, facts.max_pixels), (10, 20));
        assert!(facts.read_processor_config(r#"{"max_pixels": -1}"#, "p").is_err());
        assert!(facts.read_processor_config(r#"{"min_pixels": 30}"#, "p").is_err());
    }

    #[test]
    fn smart_resize_as_transformers() {
        // transformers 5.24 `smart_resize(1024, 1024, 28, 3136, 12845056)` = (1036, 1036).
        let image = qwen25().image_tokens(1024, 1024).expect("image");
        assert_eq!(image.resized, (1036, 1036));
        assert_eq!((image.patches, image.tokens), (74 * 74, 37 * 37));
        // The class default max_pixels, 28 × 28 × 1280: (980, 980).
        let default = VisionFacts { max_pixels: 28 * 28 * 1280, ..qwen25() };
        assert_eq!(default.image_tokens(1024, 1024).map(|i| i.resized), Some((980, 980)));
        // Python rounds halves to even: 42 / 28 = 1.5 → 2, 70 / 28 = 2.5 → 2.
        assert_eq!(qwen25().image_tokens(70, 42).map(|i| i.resized), Some((56, 56)));
        assert_eq!(qwen25().image_tokens(201 * 28, 28), None);
    }
}
