//! A vision-language model's vision tower, as far as memory is concerned: its sizes, what its
//! blocks are made of, which of them attend within windows, and how its image processor turns
//! an image into patches (the tower's tokens) and tokens of the language model.
//!
//! Two processors ([`ImageProcessor`]):
//! - transformers' `Qwen2VLImageProcessor` (Qwen2-VL, Qwen2.5-VL; Qwen3-VL uses the same rule
//!   with 16-pixel patches): `smart_resize` rounds each side to a multiple of `patch_size ×
//!   merge_size` and scales the image into `[min_pixels, max_pixels]`, keeping its aspect ratio;
//!   an image is one temporal patch (it is repeated `temporal_patch_size` times), so it gives
//!   `(h / patch) × (w / patch)` patches and a quarter as many tokens for a merge of 2;
//! - a fixed resize (`Gemma3ImageProcessor`, `SiglipImageProcessor`: `size.height × size.width`
//!   whatever the image, pan-and-scan off as published), whose patches the projector pools to a
//!   fixed count of tokens (Gemma 3's `mm_tokens_per_image`);
//! - Pixtral's longest-edge resize (Mistral 3), whose prompt adds a break token per row.

use super::{ArchFacts, LayerFacts, StackKind};
use crate::InputError;
use serde::Serialize;
use serde_json::Value;

/// The file beside `config.json` that holds the image processor's settings.
pub const PREPROCESSOR_FILE: &str = "preprocessor_config.json";

/// How the model's image processor sizes an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ImageProcessor {
    /// `Qwen2VLImageProcessor.smart_resize` into [`VisionFacts::min_pixels`,
    /// `VisionFacts::max_pixels`], `patch_size × merge_size` pixels to a side's step.
    SmartResize,
    /// Every image resized to `height × width` (`size` of the processor's config); the tower's
    /// patches are pooled into `tokens` tokens an image (Gemma 3: `mm_tokens_per_image`).
    Fixed {
        /// Height after the resize, in pixels.
        height: u64,
        /// Width after the resize, in pixels.
        width: u64,
        /// Tokens each image gives the language model.
        tokens: u64,
    },
    /// `PixtralImageProcessor`: an image whose longer side passes `longest_edge` is scaled down
    /// to it (each side `floor(side / ratio)`), then each side is rounded up to a multiple of
    /// `patch_size × merge_size` (`_num_image_tokens`); the processor writes a row of
    /// `[IMG]` tokens per `merge_size` rows of patches, each row ended by `[IMG_BREAK]` (the last
    /// by `[IMG_END]`).
    LongestEdge {
        /// The longest side an image keeps (`size.longest_edge`).
        longest_edge: u64,
    },
}

/// The vision tower of a vision-language model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VisionFacts {
    /// The tower's module path (`model.visual`, `model.vision_tower`).
    pub path: String,
    /// How the processor sizes an image.
    pub processor: ImageProcessor,
    /// The blocks' norms: RMSNorm (Qwen2.5-VL) or LayerNorm with a bias (SigLIP, Qwen3-VL).
    pub rms_norm: bool,
    /// The blocks rotate q and k (Qwen's 2-D rotary embedding); SigLIP adds learned position
    /// embeddings once, before the blocks, instead.
    pub rotary: bool,
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
    /// Blocks whose output a DeepStack merger also merges into tokens of the language model's
    /// width (Qwen3-VL's `deepstack_visual_indexes`), added to the hidden states after the
    /// first as many language layers; empty for other towers.
    pub deepstack_blocks: Vec<u64>,
    /// The tower's own `get_input_embeddings()` is its patch embedding (Qwen2.5-VL's
    /// `_input_embed_layer = "patch_embed"`, SigLIP's `patch_embedding`), which transformers'
    /// `enable_input_require_grads` hooks, so under PEFT with gradient checkpointing the tower
    /// runs with autograd; Qwen3-VL's tower has none (`NotImplementedError`, no hook).
    pub hooked_input_embeddings: bool,
    /// The tower runs every image of the batch as one sequence under a block-diagonal mask it
    /// makes for them (Pixtral's `generate_block_attention_mask`: `[1, 1, P, P]` in the compute
    /// dtype for `P` patches in all), instead of one sequence an image.
    pub packed_images: bool,
    /// The fewest pixels the processor scales an image up to (`min_pixels`, its
    /// `size.shortest_edge`).
    pub min_pixels: u64,
    /// The most pixels the processor scales an image down to (`max_pixels`, its
    /// `size.longest_edge`).
    pub max_pixels: u64,
}

/// The largest image side vramplan takes, in pixels (docs/limits.md).
pub const MAX_SIDE: u64 = 1 << 20;

/// What one image becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ImageTokens {
    /// Height and width after the processor's resize, in pixels.
    pub resized: (u64, u64),
    /// Patches the tower's blocks run on (`grid_t × grid_h × grid_w`).
    pub patches: u64,
    /// Tokens the image takes in the prompt: its features' placeholders (`<|image_pad|>`,
    /// `[IMG]`), and Pixtral's `[IMG_BREAK]`/`[IMG_END]` after each row.
    pub tokens: u64,
    /// Feature vectors the merger hands the language model (`patches / merge²`, or Gemma 3's
    /// pooled count): the placeholders' embeddings.
    pub features: u64,
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
    /// Reads the model's `preprocessor_config.json` (`text`, from `origin`). For smart_resize,
    /// the pixel bounds: `min_pixels` / `max_pixels` as the published files give them, or `size.
    /// shortest_edge` / `size.longest_edge` as transformers 5.x saves them (which the processor
    /// reads the same way, `Qwen2VLImageProcessor.__init__`); for a fixed resize, `size.height`
    /// and `size.width`. Absent keys keep the class defaults.
    pub fn read_processor_config(&mut self, text: &str, origin: &str) -> Result<(), InputError> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            InputError::new(origin, format!("not valid JSON: {e}"))
                .with_fix("give the model's preprocessor_config.json as published")
        })?;
        if let ImageProcessor::Fixed { height, width, tokens } = self.processor {
            let side = |key: &str, default: u64| -> Result<u64, InputError> {
                match value.get("size").and_then(|s| s.get(key)) {
                    None => Ok(default),
                    Some(found) => found.as_u64().filter(|&n| n > 0 && n <= 1 << 20).ok_or_else(|| {
                        InputError::new(origin, format!("`size.{key}` is {found}, not a size in pixels"))
                            .at_key(format!("size.{key}"))
                            .with_fix("give a positive whole number of pixels")
                    }),
                }
            };
            let (height, width) = (side("height", height)?, side("width", width)?);
            self.processor = ImageProcessor::Fixed { height, width, tokens };
            return Ok(());
        }
        if let ImageProcessor::LongestEdge { longest_edge } = self.processor {
            let longest_edge = match value.get("size").and_then(|s| s.get("longest_edge")) {
                None => longest_edge,
                Some(found) => found.as_u64().filter(|&n| n > 0 && n <= MAX_SIDE).ok_or_else(|| {
                    InputError::new(origin, format!("`size.longest_edge` is {found}, not a size in pixels"))
                        .at_key("size.longest_edge")
                        .with_fix("give a positive whole number of pixels")
                })?,
            };
            self.processor = ImageProcessor::LongestEdge { longest_edge };
            return Ok(());
        }
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
    /// the processor does, or with a side past [`MAX_SIDE`].
    pub fn image_tokens(&self, width: u64, height: u64) -> Option<ImageTokens> {
        if let ImageProcessor::Fixed { height, width, tokens } = self.processor {
            let patch = self.patch_size.max(1);
            return Some(ImageTokens {
                resized: (height, width),
                patches: (height / patch) * (width / patch),
                tokens,
                features: tokens,
            });
        }
        let (w, h) = (width.max(1), height.max(1));
        if let ImageProcessor::LongestEdge { longest_edge } = self.processor {
            if w.max(h) > MAX_SIDE {
                return None;
            }
            let (mut h, mut w) = (h, w);
            if h.max(w) > longest_edge {
                // `ratio = max(h / L, w / L)`; `floor(side / ratio)` in the processor's floats.
                let ratio = h.max(w) as f64 / longest_edge as f64;
                h = ((h as f64 / ratio).floor() as u64).max(1);
                w = ((w as f64 / ratio).floor() as u64).max(1);
            }
            let step = (self.patch_size * self.merge_size).max(1);
            let (rows, cols) = (h.div_ceil(step), w.div_ceil(step));
            let features = rows * cols;
            return Some(ImageTokens {
                resized: (rows * step, cols * step),
                patches: features * self.merge_size * self.merge_size,
                tokens: features + rows,
                features,
            });
        }
        // Past MAX_SIDE (the workload's bound) the products below could overflow.
        if w.max(h) > 200 * w.min(h) || w.max(h) > MAX_SIDE {
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
        let tokens = patches / (self.merge_size * self.merge_size);
        Some(ImageTokens { resized: (h_bar, w_bar), patches, tokens, features: tokens })
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

    /// Adds this tower to a model's `facts`: its `depth` blocks, `{blocks}.0` on, become
    /// [`StackKind::Vision`] layers ahead of the language model's (the tower runs first), and
    /// the tower's facts become [`ArchFacts::vision`].
    pub(crate) fn attach(self, facts: &mut ArchFacts, blocks: &str, depth: u64) {
        let tower = (0..depth).map(|i| LayerFacts {
            path: format!("{blocks}.{i}"),
            stack: StackKind::Vision,
            moe: false,
            attention_window: None,
            cross_attention: false,
            ssm: None,
        });
        facts.layers.splice(0..0, tower);
        facts.vision = Some(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen25() -> VisionFacts {
        VisionFacts {
            path: "model.visual".into(),
            processor: ImageProcessor::SmartResize,
            rms_norm: true,
            rotary: true,
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
            deepstack_blocks: Vec::new(),
            hooked_input_embeddings: true,
            packed_images: false,
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

    #[test]
    fn fixed_resize_whatever_the_image() {
        // Gemma 3: 896 × 896 pixels, 14-pixel patches (64 × 64), pooled to 256 tokens.
        let mut gemma = VisionFacts {
            processor: ImageProcessor::Fixed { height: 896, width: 896, tokens: 256 },
            patch_size: 14,
            ..qwen25()
        };
        let image = gemma.image_tokens(1024, 300).expect("image");
        assert_eq!((image.resized, image.patches, image.tokens), ((896, 896), 4096, 256));
        gemma.read_processor_config(r#"{"size": {"height": 448, "width": 448}}"#, "p").expect("reads");
        assert_eq!(gemma.image_tokens(10, 10).map(|i| i.patches), Some(1024));
        assert!(gemma.read_processor_config(r#"{"size": {"height": 0}}"#, "p").is_err());
    }

    #[test]
    fn longest_edge_as_pixtral() {
        // transformers 5.24 `get_resize_output_image_size` with longest_edge 1540 and patch 28
        // (14 × merge 2): 3000 × 2000 → floor(2000 / (3000/1540)) = 1026 → 37 rows of 28,
        // 1540 → 55 columns; [IMG] × 55 and a break per row.
        let pixtral = VisionFacts {
            processor: ImageProcessor::LongestEdge { longest_edge: 1540 },
            patch_size: 14,
            ..qwen25()
        };
        let image = pixtral.image_tokens(3000, 2000).expect("image");
        assert_eq!(image.resized, (37 * 28, 55 * 28));
        assert_eq!((image.features, image.tokens, image.patches), (37 * 55, 37 * 56, 37 * 55 * 4));
        // Smaller than the edge: no resize, each side rounded up (100 → 4 × 28).
        assert_eq!(pixtral.image_tokens(100, 30).map(|i| i.resized), Some((56, 112)));
    }
}
