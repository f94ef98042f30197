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
//! - Pixtral's longest-edge resize (Mistral 3), whose prompt adds a break token per row;
//! - Llama 4's tiles (`Llama4ImageProcessor`): the image is fitted to a canvas of up to
//!   `max_patches` square tiles, each tile its own sequence in the tower, plus a global tile
//!   of the whole image where there is more than one.
//! - Phi-4 multimodal's dynamic HD crops (`Phi4MultimodalImageProcessor`): the image is
//!   fitted to a canvas of up to `dynamic_hd` crops of 448 pixels, each crop and a global
//!   image its own sequence in the tower, the prompt counting the 2 × 2-pooled patches the
//!   padding leaves and a separator after each row.

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
    /// `Llama4ImageProcessor`: the canvas of `rows × cols` tiles of `tile` pixels (`rows ×
    /// cols ≤ max_tiles`) that `get_best_fit` picks for the image, split into its tiles, with a
    /// global tile (the whole image resized to one tile) after them where there is more than
    /// one. Each tile's patches are pixel-shuffled to a quarter (`pixel_shuffle_ratio` 0.5,
    /// [`VisionFacts::merge_size`] 2) and each gives that many `<|patch|>` tokens; the prompt
    /// (`Llama4Processor._prompt_split_image`) adds `<|image_start|>`, a `<|tile_x_separator|>`
    /// between tiles of a row, a `<|tile_y_separator|>` after each row, `<|image|>` before the
    /// global tile and `<|image_end|>`.
    Tiled {
        /// Side of a square tile in pixels (`size.height`).
        tile: u64,
        /// The most tiles of the canvas (`max_patches`).
        max_tiles: u64,
        /// The canvas that scales the image most (`resize_to_max_canvas`), rather than least.
        max_canvas: bool,
    },
    /// `Phi4MultimodalImageProcessor` (transformers 5.24 `image_processing_phi4_multimodal.py`,
    /// 4.57's `…Fast`): `dynamic_preprocess` fits the image to a canvas of `rows × cols` crops of
    /// `crop` pixels (`ceil(side / crop)` each way, or where that makes more than `max_crops`
    /// the crop grid of the closest aspect ratio), resizes it into the canvas keeping its aspect
    /// ratio and pads the rest; the tower runs the global image (the canvas resized to one crop)
    /// and every crop, each its own sequence ([`ImageTokens::tiles`]). The prompt's
    /// `num_img_tokens`: the global image's 2 × 2-pooled patches with a separator after each
    /// row, one separator between, and the crops' pooled patches the padding leaves (every
    /// other row and column of the crops' patch mask) with a separator after each row.
    DynamicHd {
        /// Side of a square crop in pixels (`size.height`, 448).
        crop: u64,
        /// The most crops of the canvas (`dynamic_hd`, 36).
        max_crops: u64,
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
    /// The tower prepends (appends, Llama 4) a learned class token to each image's (each
    /// tile's) patches, so each sequence it attends over is one longer than its patches.
    pub class_token: bool,
    /// Bytes of one value of the processor's `pixel_values`: 4 (float32) for most processors;
    /// 2 for Llama 4's, which rescales and normalises in bfloat16
    /// (`Llama4ImageProcessor.rescale_and_normalize`).
    pub pixel_value_bytes: u64,
    /// Modules beside the tower that a step with images and text never runs (Phi-4
    /// multimodal's audio embedding, `model.embed_tokens_extend.audio_embed`: audio inputs are
    /// not a vramplan workload): their weights are held, nothing of theirs is charged as
    /// activations. Empty for other models.
    pub idle_paths: Vec<String>,
    /// The module that holds the tower with what runs beside it (its projections, its
    /// separators), where it is defined after the language model's layers but runs before them
    /// (Phi-4 multimodal's `model.embed_tokens_extend.image_embed`, which the model's forward
    /// runs on the input embeddings): the step and the plans take it ahead of the first layer,
    /// so a projection is never placed after the layers it feeds. `None` where the tower's own
    /// path says it.
    pub runs_first: Option<String>,
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
    /// Sequences the tower runs the image as: Llama 4's tiles, 1 for other towers (which split
    /// an image into windows by [`VisionFacts::attended_patches`] instead).
    pub tiles: u64,
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

/// `get_best_fit` of `Llama4ImageProcessor` (transformers 5.24 `image_processing_llama4.py`)
/// for an image of `height × width`: the canvas of `rows × cols` tiles, `rows × cols ≤
/// max_tiles`, tiles of `T = tile` pixels, that scales the image least while not shrinking it
/// (the image's limiting scale, `min(rows·T / height, cols·T / width)`, the smallest of those
/// ≥ 1; where none is, the largest below 1), or most (`max_canvas`); of canvases with that
/// scale, the smallest area, the first in `find_supported_resolutions`' order. The scales are
/// computed as it computes them: `rows·T / height` in float32.
fn best_canvas(height: u64, width: u64, tile: u64, max_tiles: u64, max_canvas: bool) -> (u64, u64) {
    // `find_supported_resolutions`: for chunks max..1, each factor pair (h, w), grouped by
    // aspect ratio in the order each ratio first appears.
    let mut groups: Vec<(f64, Vec<(u64, u64)>)> = Vec::new();
    for chunks in (1..=max_tiles.clamp(1, 4096)).rev() {
        for h in (1..=chunks).filter(|h| chunks % h == 0) {
            let (h, w) = (h, chunks / h);
            let ratio = h as f64 / w as f64;
            match groups.iter_mut().find(|(r, _)| *r == ratio) {
                Some((_, list)) => list.push((h, w)),
                None => groups.push((ratio, vec![(h, w)])),
            }
        }
    }
    let canvases: Vec<(u64, u64)> = groups.into_iter().flat_map(|(_, list)| list).collect();
    let scale = |&(h, w): &(u64, u64)| -> f32 {
        let (sh, sw) = ((h * tile) as f32 / height as f32, (w * tile) as f32 / width as f32);
        if sh > sw { sw } else { sh }
    };
    let scales: Vec<f32> = canvases.iter().map(scale).collect();
    let up = scales.iter().copied().filter(|s| *s >= 1.0);
    let chosen = if max_canvas { up.reduce(f32::max) } else { up.reduce(f32::min) }
        .or_else(|| scales.iter().copied().filter(|s| *s < 1.0).reduce(f32::max))
        .unwrap_or(1.0);
    // The smallest area among those, the first in order (`torch.argmin`).
    canvases
        .iter()
        .zip(&scales)
        .filter(|(_, s)| **s == chosen)
        .map(|(c, _)| *c)
        .min_by_key(|(h, w)| h * w)
        .unwrap_or((1, 1))
}

/// `Phi4MultimodalImageProcessor._preprocess` for an image of `width × height` with crops of
/// `crop` pixels, at most `max_crops`, and `patch`-pixel patches (transformers 5.24): the
/// canvas, the crops the tower runs (the global image first) and `num_img_tokens`; `None` where
/// the processor refuses the image (a side under 10 pixels once fitted). Of crop grids as close
/// to the image's aspect ratio as each other, `find_closest_aspect_ratio` keeps the last in
/// order of their crop count where the image's area is more than half the grid's; grids of the
/// same count come in the order of a Python set there, here by columns (only an aspect ratio
/// exactly between two such grids' tells them apart).
fn dynamic_hd(width: u64, height: u64, crop: u64, max_crops: u64, patch: u64) -> Option<ImageTokens> {
    let (w, h) = (width as f64, height as f64);
    let (mut cols, mut rows) = (width.div_ceil(crop), height.div_ceil(crop));
    if cols * rows > max_crops {
        let aspect = w / h;
        let mut grids: Vec<(u64, u64)> =
            (1..=max_crops).flat_map(|i| (1..=max_crops / i).map(move |j| (i, j))).collect();
        grids.sort_by_key(|&(i, j)| i * j);
        let (mut best, mut best_diff) = ((1, 1), f64::INFINITY);
        for (i, j) in grids {
            let diff = (aspect - i as f64 / j as f64).abs();
            if diff < best_diff {
                (best, best_diff) = ((i, j), diff);
            } else if diff == best_diff && w * h > 0.5 * crop as f64 * crop as f64 * i as f64 * j as f64 {
                best = (i, j);
            }
        }
        (cols, rows) = best;
    }
    let (canvas_w, canvas_h) = (crop * cols, crop * rows);
    let (ratio_w, ratio_h) = (canvas_w as f64 / w, canvas_h as f64 / h);
    // The resized image (Python's `int()` of the scaled side) and the padding after it.
    let (new_w, new_h) =
        if ratio_w < ratio_h { (canvas_w, (h * ratio_w) as u64) } else { ((w * ratio_h) as u64, canvas_h) };
    if new_h.min(canvas_h) < 10 || new_w.min(canvas_w) < 10 {
        return None;
    }
    let (pad_w, pad_h) = (canvas_w.saturating_sub(new_w), canvas_h.saturating_sub(new_h));
    // The patch mask: `crop / patch` a crop a side, the padding's whole patches zeroed at the
    // end; the pooled mask keeps every other row and column of each crop's.
    let mask = crop / patch.max(1);
    let zeroed = |pad: u64| if pad >= patch { pad / patch } else { 0 };
    let kept = |crops: u64, pad: u64| -> u64 {
        let valid = (mask * crops).saturating_sub(zeroed(pad));
        (0..crops).map(|k| (0..mask).step_by(2).filter(|t| k * mask + t < valid).count() as u64).sum()
    };
    let (pooled_rows, pooled_cols) = (kept(rows, pad_h), kept(cols, pad_w));
    let side = mask.div_ceil(2);
    let tokens = side * side + side + 1 + pooled_rows * pooled_cols + pooled_rows;
    let tiles = 1 + rows * cols;
    Some(ImageTokens {
        resized: (canvas_h, canvas_w),
        patches: tiles * mask * mask,
        tokens,
        features: tokens,
        tiles,
    })
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
        if let ImageProcessor::Tiled { tile, max_tiles, max_canvas } = self.processor {
            let number = |key: &str, default: u64, most: u64| -> Result<u64, InputError> {
                let found = key.split('.').try_fold(&value, |v, k| v.get(k));
                match found {
                    None => Ok(default),
                    Some(found) => found.as_u64().filter(|&n| n > 0 && n <= most).ok_or_else(|| {
                        InputError::new(
                            origin,
                            format!("`{key}` is {found}, not a whole number from 1 to {most}"),
                        )
                        .at_key(key)
                        .with_fix("give the model's preprocessor_config.json as published")
                    }),
                }
            };
            let (height, width) =
                (number("size.height", tile, MAX_SIDE)?, number("size.width", tile, MAX_SIDE)?);
            if height != width {
                return Err(InputError::new(
                    origin,
                    format!("tiles of {height} × {width} pixels are not square"),
                )
                .at_key("size")
                .with_fix("Llama4ImageProcessor takes square tiles (`size` must be square)"));
            }
            let max_tiles = number("max_patches", max_tiles, 4096)?;
            let max_canvas = match value.get("resize_to_max_canvas") {
                None => max_canvas,
                Some(found) => found.as_bool().ok_or_else(|| {
                    InputError::new(origin, format!("`resize_to_max_canvas` is {found}, not true or false"))
                        .at_key("resize_to_max_canvas")
                        .with_fix("give true or false")
                })?,
            };
            self.processor = ImageProcessor::Tiled { tile: height, max_tiles, max_canvas };
            return Ok(());
        }
        if let ImageProcessor::DynamicHd { crop, max_crops } = self.processor {
            let number = |path: &[&str], default: u64, most: u64| -> Result<u64, InputError> {
                match path.iter().try_fold(&value, |v, k| v.get(k)) {
                    None => Ok(default),
                    Some(found) => found.as_u64().filter(|&n| n > 0 && n <= most).ok_or_else(|| {
                        InputError::new(
                            origin,
                            format!("`{}` is {found}, not a whole number from 1 to {most}", path.join(".")),
                        )
                        .at_key(path.join("."))
                        .with_fix("give the model's preprocessor_config.json as published")
                    }),
                }
            };
            let height = number(&["size", "height"], crop, MAX_SIDE)?;
            let width = number(&["size", "width"], crop, MAX_SIDE)?;
            if height != width {
                return Err(InputError::new(
                    origin,
                    format!("crops of {height} × {width} pixels are not square"),
                )
                .at_key("size")
                .with_fix("Phi4MultimodalImageProcessor takes square crops (`size` must be square)"));
            }
            let max_crops = number(&["dynamic_hd"], max_crops, 4096)?;
            self.processor = ImageProcessor::DynamicHd { crop: height, max_crops };
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
    /// the processor does, or with a side past [`MAX_SIDE`]; Phi-4 multimodal's dynamic HD one
    /// with a side under 10 pixels once fitted to its crops, as its processor does.
    pub fn image_tokens(&self, width: u64, height: u64) -> Option<ImageTokens> {
        if let ImageProcessor::Fixed { height, width, tokens } = self.processor {
            let patch = self.patch_size.max(1);
            return Some(ImageTokens {
                resized: (height, width),
                patches: (height / patch) * (width / patch),
                tokens,
                features: tokens,
                tiles: 1,
            });
        }
        let (w, h) = (width.max(1), height.max(1));
        if let ImageProcessor::Tiled { tile, max_tiles, max_canvas } = self.processor {
            if w.max(h) > MAX_SIDE {
                return None;
            }
            let (rows, cols) = best_canvas(h, w, tile, max_tiles, max_canvas);
            let tiles = rows * cols + u64::from(rows * cols > 1);
            let side = tile / self.patch_size.max(1);
            let per_tile = side * side / (self.merge_size * self.merge_size).max(1);
            let features = tiles * per_tile;
            // `<|image_start|>`, `<|image|>`, `<|image_end|>`; a separator between the tiles of
            // a row and after each row, where there is more than one tile.
            let separators = if rows * cols > 1 { rows * cols } else { 0 };
            return Some(ImageTokens {
                resized: (rows * tile, cols * tile),
                patches: tiles * side * side,
                tokens: features + separators + 3,
                features,
                tiles,
            });
        }
        if let ImageProcessor::DynamicHd { crop, max_crops } = self.processor {
            if w.max(h) > MAX_SIDE {
                return None;
            }
            return dynamic_hd(w, h, crop, max_crops, self.patch_size);
        }
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
                tiles: 1,
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
        Some(ImageTokens { resized: (h_bar, w_bar), patches, tokens, features: tokens, tiles: 1 })
    }

    /// The processor's settings that size an image, in its config's words
    /// (`min_pixels 3136, max_pixels 12845056`; `size 896 × 896`).
    pub fn processor_settings(&self) -> String {
        match self.processor {
            ImageProcessor::SmartResize => {
                format!("min_pixels {}, max_pixels {}", self.min_pixels, self.max_pixels)
            }
            ImageProcessor::Fixed { height, width, .. } => format!("size {height} × {width}"),
            ImageProcessor::LongestEdge { longest_edge } => format!("longest_edge {longest_edge}"),
            ImageProcessor::Tiled { tile, max_tiles, max_canvas } => {
                format!("size {tile} × {tile}, max_patches {max_tiles}, resize_to_max_canvas {max_canvas}")
            }
            ImageProcessor::DynamicHd { crop, max_crops } => {
                format!("size {crop} × {crop}, dynamic_hd {max_crops}")
            }
        }
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
            class_token: false,
            pixel_value_bytes: 4,
            idle_paths: Vec::new(),
            runs_first: None,
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
    fn tiles_as_llama4() {
        // transformers 5.24 `Llama4ImageProcessor()` (336-pixel tiles, max_patches 16) on an
        // image of each size: its `aspect_ratios`, `pixel_values.shape[0]` (the tiles and the
        // global tile), and the tokens `Llama4Processor._prompt_split_image` writes (all, and
        // `<|patch|>`), with torchvision 0.29.2.
        let llama4 = VisionFacts {
            processor: ImageProcessor::Tiled { tile: 336, max_tiles: 16, max_canvas: false },
            patch_size: 14,
            merge_size: 2,
            ..qwen25()
        };
        let cases = [
            ((1024, 1024), (4, 4), 17, 2467, 2448),
            ((336, 336), (1, 1), 1, 147, 144),
            ((200, 300), (1, 1), 1, 147, 144),
            ((3000, 2000), (3, 5), 16, 2322, 2304),
            ((640, 480), (2, 2), 5, 727, 720),
            ((100, 2000), (6, 1), 7, 1017, 1008),
            ((1024, 768), (3, 4), 13, 1887, 1872),
            ((4032, 3024), (3, 4), 13, 1887, 1872),
            ((1000, 1), (1, 3), 4, 582, 576),
        ];
        for ((width, height), (rows, cols), tiles, tokens, features) in cases {
            let image = llama4.image_tokens(width, height).expect("image");
            assert_eq!(image.resized, (rows * 336, cols * 336), "{width}x{height}");
            assert_eq!(
                (image.tiles, image.tokens, image.features),
                (tiles, tokens, features),
                "{width}x{height}"
            );
            assert_eq!(image.patches, tiles * 576);
        }
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

    #[test]
    fn dynamic_hd_as_phi4_multimodal() {
        // transformers 5.24 `Phi4MultimodalImageProcessor()` (448-pixel crops, dynamic_hd 36,
        // patch 14) on a blank RGB image of each width × height, torchvision 0.29.2:
        // `image_sizes` (the canvas, height × width), `image_pixel_values.shape[1]` (the global
        // image and the crops) and `num_img_tokens`, printed by
        //   scripts/reference/.venv5/bin/python -c 'from PIL import Image; from transformers import
        //   Phi4MultimodalImageProcessor as P; o = P()(Image.new("RGB", (W, H)));
        //   print(o["image_sizes"], o["image_pixel_values"].shape, o["num_img_tokens"])'
        let phi4 = VisionFacts {
            processor: ImageProcessor::DynamicHd { crop: 448, max_crops: 36 },
            patch_size: 14,
            ..qwen25()
        };
        let cases = [
            ((448, 448), (448, 448), 2, 545),
            ((1024, 1024), (1344, 1344), 10, 2625),
            ((640, 480), (896, 896), 5, 1065),
            ((1920, 1080), (1344, 2240), 16, 3918),
            ((3000, 2000), (2240, 3136), 36, 8748),
            ((4032, 3024), (1344, 1792), 13, 3393),
            ((100, 2000), (2240, 448), 6, 673),
            ((5000, 500), (896, 5376), 25, 4133),
            ((6720, 4480), (1792, 2688), 25, 6481),
            ((8000, 8000), (2688, 2688), 37, 9585),
            ((200, 300), (448, 448), 2, 465),
            ((1024, 768), (896, 1344), 7, 1681),
            ((1540, 1540), (1792, 1792), 17, 4433),
            ((896, 896), (896, 896), 5, 1329),
            ((2000, 50), (448, 2240), 6, 435),
        ];
        for ((width, height), resized, crops, tokens) in cases {
            let image = phi4.image_tokens(width, height).expect("image");
            assert_eq!(image.resized, resized, "{width}x{height}");
            assert_eq!(
                (image.tiles, image.tokens, image.features),
                (crops, tokens, tokens),
                "{width}x{height}"
            );
            assert_eq!(image.patches, crops * 1024, "{width}x{height}");
        }
        // A side under 10 pixels once fitted: the processor's "aspect ratio is very extreme".
        assert_eq!(phi4.image_tokens(5000, 5), None);
        let mut read = phi4.clone();
        read.read_processor_config(r#"{"dynamic_hd": 16, "size": {"height": 448, "width": 448}}"#, "p")
            .expect("reads");
        assert_eq!(read.processor, ImageProcessor::DynamicHd { crop: 448, max_crops: 16 });
        assert!(read.read_processor_config(r#"{"size": {"height": 448, "width": 336}}"#, "p").is_err());
        assert!(read.read_processor_config(r#"{"dynamic_hd": 0}"#, "p").is_err());
    }
}
