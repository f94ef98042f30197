//! `Phi4MultimodalForCausalLM` (Phi-4-multimodal-instruct) as transformers builds it
//! (`modeling_phi4_multimodal.py`, 5.24 and 4.57, the same names in both): the Phi-3 decoder
//! (`qkv_proj`, `gate_up_proj`, partial rotary embeddings) with its classes renamed, and under
//! `model.embed_tokens_extend` the image and audio encoders that write their features into the
//! input embeddings.
//!
//! - `image_embed` (`Phi4MultimodalImageEmbedding`): the learnable HD separators
//!   `global_img_feature_extensor` `[1, 1, width]` and `sub_img_feature_extensor`
//!   `[1, 1, 1, width]`, the SigLIP-like `img_processor` (`embeddings.{patch_embedding,
//!   position_embedding}`, `encoder.layers.N.{layer_norm1, self_attn.{k_proj, v_proj, q_proj,
//!   out_proj}, layer_norm2, mlp.{fc1, fc2}}`, `post_layernorm`, and the pooling `head`: `probe`,
//!   an `nn.MultiheadAttention` with `in_proj_weight`/`in_proj_bias` and `out_proj`, a LayerNorm
//!   and an MLP), the parameterless 2 × 2 `image_token_compression` (and a reflection pad where
//!   the patch grid is odd), and `img_projection_up` / `img_projection_down`.
//! - `audio_embed` (`Phi4MultimodalAudioEmbedding`): the conformer `encoder` (the mean/variance
//!   buffers `encoder_embedding.{global_mean, global_invstd}`, persistent, in the model's dtype;
//!   the NeMo subsampling convolutions `embed.conv.{0, 2, 3, 5, 6, …}` and `embed.out`; the T5
//!   relative attention bias; `encoders.N` with two half-step MLPs, attention, a GLU / depthwise
//!   convolution module and two LayerNorms) and the speech and vision-speech projections.
//!
//! Audio is not a vramplan workload: the audio encoder's weights and buffers are described
//! exactly, but nothing of it runs in a step (its activations are not charged).
//!
//! The remote-code model carried its vision and speech LoRA adapters inside the checkpoint;
//! transformers' port drops them (its conversion script extracts them into PEFT adapters,
//! `vision-lora` r 256 and `speech-lora` r 320 over `qkv_proj`, `o_proj`, `gate_up_proj`,
//! `down_proj`), so the tree has none.
//!
//! `_no_split_modules`: 5.24's `_get_no_split_modules` gives the decoder layer only, so the
//! audio encoder's layers are plain modules there (4.57 also names
//! `Phi4MultimodalVisionEncoderLayer` and `Phi4MultimodalAudioConformerEncoderLayer`); the
//! tower's layers are blocks in both, the layers the simulator runs the images through
//! (`no_split_classes` keep transformers' list).

use super::HfConfig;
use super::nested_text::{TowerSizes, VISION_KEYS};
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, Tensor, join};
use serde_json::Value;

/// `Phi4MultimodalVisionConfig`'s defaults (transformers 5.24 and 4.57).
const VISION_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 1152),
    ("intermediate_size", 4304),
    ("num_hidden_layers", 27),
    ("num_attention_heads", 16),
    ("patch_size", 14),
    ("num_channels", 3),
];

/// `Phi4MultimodalConfig`'s defaults for the decoder's sizes (transformers 5.24 and 4.57), which
/// the Phi-3 reading has no default for.
const TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 200_064),
    ("hidden_size", 3072),
    ("intermediate_size", 8192),
    ("num_hidden_layers", 32),
    ("num_attention_heads", 32),
    ("num_key_value_heads", 8),
];

/// `Phi4MultimodalImageProcessor.dynamic_hd`: the most crops an image is cut into.
const DEFAULT_DYNAMIC_HD: u64 = 36;

/// Phi-3's classes and the Phi-4 multimodal classes that replace them.
const CLASSES: &[(&str, &str)] = &[
    ("Phi3Model", "Phi4MultimodalModel"),
    ("Phi3DecoderLayer", "Phi4MultimodalDecoderLayer"),
    ("Phi3Attention", "Phi4MultimodalAttention"),
    ("Phi3MLP", "Phi4MultimodalMLP"),
    ("Phi3RMSNorm", "Phi4MultimodalRMSNorm"),
    ("Phi3RotaryEmbedding", "Phi4MultimodalRotaryEmbedding"),
];

/// The sizes of `audio_config` (`Phi4MultimodalAudioConfig`, transformers 5.24 and 4.57) the
/// tree depends on.
struct AudioSizes {
    hidden: u64,
    intermediate: u64,
    blocks: u64,
    heads: u64,
    ext_pw_out: u64,
    separable_out: u64,
    multiplier: u64,
    kernel: u64,
    input: u64,
    time_reduction: u64,
    max_distance: u64,
    symmetric: bool,
    conv_channels: u64,
    downsample: u64,
}

impl AudioSizes {
    fn read(audio: &HfConfig) -> Result<AudioSizes, InputError> {
        let time_reduction = audio.positive_or(&["time_reduction"], 8)?;
        if !time_reduction.is_power_of_two() || time_reduction < 2 {
            return Err(InputError::new(
                audio.origin(),
                format!("`time_reduction` {time_reduction} is not a power of 2"),
            )
            .at_key("time_reduction")
            .with_fix(
                "the NeMo subsampling halves the time axis log2(time_reduction) times: give 2, 4, 8, …",
            ));
        }
        let sizes = AudioSizes {
            hidden: audio.positive_or(&["hidden_size"], 1024)?,
            intermediate: audio.positive_or(&["intermediate_size"], 1536)?,
            blocks: audio.positive_or(&["num_blocks"], 24)?,
            heads: audio.positive_or(&["num_attention_heads"], 16)?,
            ext_pw_out: audio.positive_or(&["ext_pw_out_channel"], 1024)?,
            separable_out: audio.positive_or(&["depthwise_separable_out_channel"], 1024)?,
            multiplier: audio.positive_or(&["depthwise_multiplier"], 1)?,
            kernel: audio.positive_or(&["kernel_size"], 3)?,
            input: audio.positive_or(&["input_size"], 80)?,
            time_reduction,
            max_distance: audio.positive_or(&["bias_max_distance"], 1000)?,
            symmetric: audio.bool_or(&["bias_symmetric"], false)?,
            conv_channels: audio.positive_or(&["nemo_conv_channels"], 1024)?,
            downsample: audio.positive_or(&["downsample_rate"], 1)?,
        };
        if !sizes.hidden.is_multiple_of(sizes.heads) {
            return Err(InputError::new(
                audio.origin(),
                format!("{} attention heads do not divide the width {}", sizes.heads, sizes.hidden),
            )
            .at_key("num_attention_heads")
            .with_fix("the published audio encoder has 16 heads of 64"));
        }
        Ok(sizes)
    }

    /// The frequency bins left after the subsampling (`nemo_final_size`: `input_size` through
    /// `floor((n - 1) / 2 + 1)` once per halving).
    fn final_size(&self) -> u64 {
        (0..self.time_reduction.trailing_zeros()).fold(self.input, |n, _| (n - 1) / 2 + 1)
    }
}

/// The nested config at `key`, or an empty one (the config class's defaults) where absent.
fn sub_config(config: &HfConfig, key: &str) -> Result<HfConfig, InputError> {
    let origin = format!("{} ({key})", config.origin());
    match config.object().get(key) {
        None | Some(Value::Null) => Ok(HfConfig::from_object(Default::default(), &origin)),
        Some(Value::Object(object)) => Ok(HfConfig::from_object(object.clone(), &origin)),
        Some(other) => Err(InputError::new(config.origin(), format!("`{key}` is {other}, not an object"))
            .at_key(key)
            .with_fix("give the model's published config.json")),
    }
}

/// A `Conv{1,2}d` at `parent.name` with a bias: weight `[out, in / groups, kernel…]`.
fn conv(b: &Builder, parent: &str, name: &str, class: &str, weight: &[u64]) -> Module {
    Module::new(join(parent, name), class, ModuleKind::Other)
        .with_tensor(Tensor::parameter("weight", weight, b.dtype))
        .with_tensor(Tensor::parameter("bias", &weight[..1], b.dtype))
}

/// A layer of the audio encoder: a block in 4.57 (its `_no_split_modules` names the class), a
/// plain module in 5.24 (whose list names the decoder layer only).
fn layer(b: &Builder, parent: &str, name: &str, class: &str) -> Module {
    match b.naming {
        Naming::V4 => b.block(parent, name, class),
        Naming::V5 => b.container(parent, name, class),
    }
}

/// `Phi4MultimodalVisionMLP` at `parent.mlp`.
fn vision_mlp(b: &Builder, parent: &str, hidden: u64, intermediate: u64) -> Module {
    let path = join(parent, "mlp");
    b.container(parent, "mlp", "Phi4MultimodalVisionMLP")
        .with_child(b.linear(&path, "fc1", hidden, intermediate, true))
        .with_child(b.linear(&path, "fc2", intermediate, hidden, true))
}

/// `Phi4MultimodalImageEmbedding` at `parent.image_embed`, and the tower's blocks' list path.
fn image_embed(b: &Builder, parent: &str, v: &TowerSizes, image_size: u64, hidden: u64) -> (Module, String) {
    let path = join(parent, "image_embed");
    let tower = join(&path, "img_processor");
    let layers = format!("{tower}.encoder.layers");
    let blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let block = format!("{layers}.{i}");
            let attn = format!("{block}.self_attn");
            b.block(&layers, &i.to_string(), "Phi4MultimodalVisionEncoderLayer")
                .with_child(b.norm(&block, "layer_norm1", "LayerNorm", v.hidden, true))
                .with_child(
                    b.container(&block, "self_attn", "Phi4MultimodalVisionAttention")
                        .with_child(b.linear(&attn, "k_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "v_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "q_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "out_proj", v.hidden, v.hidden, true)),
                )
                .with_child(b.norm(&block, "layer_norm2", "LayerNorm", v.hidden, true))
                .with_child(vision_mlp(b, &block, v.hidden, v.intermediate))
        })
        .collect();
    let side = image_size / v.patch;
    let embeddings_path = join(&tower, "embeddings");
    let embeddings = b
        .container(&tower, "embeddings", "Phi4MultimodalVisionEmbeddings")
        .with_child(conv(
            b,
            &embeddings_path,
            "patch_embedding",
            "Conv2d",
            &[v.hidden, v.channels, v.patch, v.patch],
        ))
        .with_child(b.embedding(&embeddings_path, "position_embedding", side * side, v.hidden));
    let head_path = join(&tower, "head");
    let mha_path = join(&head_path, "attention");
    let head = b
        .container(&tower, "head", "Phi4MultimodalVisionMultiheadAttentionPoolingHead")
        .with_tensor(Tensor::parameter("probe", &[1, 1, v.hidden], b.dtype))
        .with_child(
            Module::new(mha_path.clone(), "MultiheadAttention", ModuleKind::Other)
                .with_tensor(Tensor::parameter("in_proj_weight", &[3 * v.hidden, v.hidden], b.dtype))
                .with_tensor(Tensor::parameter("in_proj_bias", &[3 * v.hidden], b.dtype))
                .with_child({
                    let mut out = b.linear(&mha_path, "out_proj", v.hidden, v.hidden, true);
                    out.class = "NonDynamicallyQuantizableLinear".into();
                    out
                }),
        )
        .with_child(b.norm(&head_path, "layernorm", "LayerNorm", v.hidden, true))
        .with_child(vision_mlp(b, &head_path, v.hidden, v.intermediate));
    let img_processor = b
        .container(&path, "img_processor", "Phi4MultimodalVisionModel")
        .with_child(embeddings)
        .with_child(b.container(&tower, "encoder", "Phi4MultimodalVisionEncoder").with_child(b.module_list(
            &join(&tower, "encoder"),
            "layers",
            blocks,
        )))
        .with_child(b.norm(&tower, "post_layernorm", "LayerNorm", v.hidden, true))
        .with_child(head);
    let mut embed = b
        .container(parent, "image_embed", "Phi4MultimodalImageEmbedding")
        .with_tensor(Tensor::parameter("global_img_feature_extensor", &[1, 1, v.hidden], b.dtype))
        .with_tensor(Tensor::parameter("sub_img_feature_extensor", &[1, 1, 1, v.hidden], b.dtype));
    if !side.is_multiple_of(2) {
        embed = embed.with_child(Module::new(
            join(&path, "img_processor_padding"),
            "ReflectionPad2d",
            ModuleKind::Other,
        ));
    }
    let embed = embed
        .with_child(b.dropout(&path, "drop"))
        .with_child(img_processor)
        .with_child(Module::new(join(&path, "image_token_compression"), "AvgPool2d", ModuleKind::Other))
        .with_child(b.linear(&path, "img_projection_up", v.hidden, hidden, true))
        .with_child(b.linear(&path, "img_projection_down", hidden, hidden, true));
    (embed, layers)
}

/// `Phi4MultimodalAudioMLP` at `parent.name`.
fn audio_mlp(b: &Builder, parent: &str, name: &str, a: &AudioSizes) -> Module {
    let path = join(parent, name);
    b.container(parent, name, "Phi4MultimodalAudioMLP")
        .with_child(b.norm(&path, "layer_norm", "LayerNorm", a.hidden, true))
        .with_child(b.linear(&path, "gate_up_proj", a.hidden, 2 * a.intermediate, true))
        .with_child(b.linear(&path, "down_proj", a.intermediate, a.hidden, true))
        .with_child(b.dropout(&path, "dropout"))
}

/// `Phi4MultimodalAudioEmbedding` at `parent.audio_embed`.
fn audio_embed(b: &Builder, parent: &str, a: &AudioSizes, hidden: u64) -> Module {
    let path = join(parent, "audio_embed");
    let encoder = join(&path, "encoder");
    let c = a.conv_channels;
    // `Phi4MultimodalAudioNemoConvSubsampling.conv`: a strided convolution and an activation,
    // then per further halving a depthwise strided and a pointwise convolution and an activation.
    let conv_path = format!("{encoder}.embed.conv");
    let mut convs = vec![
        conv(b, &conv_path, "0", "Conv2d", &[c, 1, 3, 3]),
        Module::new(format!("{conv_path}.1"), "ReLU", ModuleKind::Other),
    ];
    for step in 1..a.time_reduction.trailing_zeros() as u64 {
        let at = 3 * step - 1;
        convs.push(conv(b, &conv_path, &at.to_string(), "Conv2d", &[c, 1, 3, 3]));
        convs.push(conv(b, &conv_path, &(at + 1).to_string(), "Conv2d", &[c, c, 1, 1]));
        convs.push(Module::new(format!("{conv_path}.{}", at + 2), "ReLU", ModuleKind::Other));
    }
    let embed = b
        .container(&encoder, "embed", "Phi4MultimodalAudioNemoConvSubsampling")
        .with_child(Module::new(conv_path, "Sequential", ModuleKind::Container).with_children(convs))
        .with_child(b.linear(&format!("{encoder}.embed"), "out", c * a.final_size(), a.hidden, true));
    let buckets = if a.symmetric { a.max_distance } else { 2 * a.max_distance };
    let bias = b
        .container(&encoder, "relative_attention_bias_layer", "Phi4MultimodalAudioRelativeAttentionBias")
        .with_child(b.embedding(
            &format!("{encoder}.relative_attention_bias_layer"),
            "bias_values",
            buckets,
            a.heads,
        ));
    let list = format!("{encoder}.encoders");
    let layers: Vec<Module> = (0..a.blocks)
        .map(|i| {
            let block = format!("{list}.{i}");
            let (attn, conv_module) = (format!("{block}.self_attn"), format!("{block}.conv"));
            let (glu, separable) = (format!("{conv_module}.glu"), format!("{conv_module}.dw_sep_conv_1d"));
            let depthwise = a.hidden * a.multiplier;
            let convolution = b
                .container(&block, "conv", "Phi4MultimodalAudioConvModule")
                .with_child(b.norm(&conv_module, "layer_norm", "LayerNorm", a.hidden, true))
                .with_child(
                    b.container(&conv_module, "glu", "Phi4MultimodalAudioGluPointWiseConv")
                        .with_tensor(Tensor::parameter("b1", &[1, a.ext_pw_out, 1], b.dtype))
                        .with_tensor(Tensor::parameter("b2", &[1, a.ext_pw_out, 1], b.dtype))
                        .with_child(conv(
                            b,
                            &glu,
                            "ext_pw_conv_1d",
                            "Conv1d",
                            &[2 * a.ext_pw_out, a.hidden, 1],
                        )),
                )
                .with_child(
                    b.container(
                        &conv_module,
                        "dw_sep_conv_1d",
                        "Phi4MultimodalAudioDepthWiseSeparableConv1d",
                    )
                    .with_child(conv(b, &separable, "dw_conv", "Conv1d", &[depthwise, 1, a.kernel]))
                    .with_child(conv(
                        b,
                        &separable,
                        "pw_conv",
                        "Conv1d",
                        &[a.separable_out, depthwise, 1],
                    )),
                )
                .with_child(conv(b, &conv_module, "ext_pw_conv_1d", "Conv1d", &[a.ext_pw_out, a.hidden, 1]))
                .with_child(b.dropout(&conv_module, "dropout"));
            layer(b, &list, &i.to_string(), "Phi4MultimodalAudioConformerEncoderLayer")
                .with_child(audio_mlp(b, &block, "feed_forward_in", a))
                .with_child(
                    b.container(&block, "self_attn", "Phi4MultimodalAudioAttention")
                        .with_child(b.linear(&attn, "q_proj", a.hidden, a.hidden, true))
                        .with_child(b.linear(&attn, "k_proj", a.hidden, a.hidden, true))
                        .with_child(b.linear(&attn, "v_proj", a.hidden, a.hidden, true))
                        .with_child(b.linear(&attn, "o_proj", a.hidden, a.hidden, true)),
                )
                .with_child(convolution)
                .with_child(audio_mlp(b, &block, "feed_forward_out", a))
                .with_child(b.norm(&block, "layer_norm_att", "LayerNorm", a.hidden, true))
                .with_child(b.norm(&block, "layer_norm", "LayerNorm", a.hidden, true))
        })
        .collect();
    let model = b
        .container(&path, "encoder", "Phi4MultimodalAudioModel")
        .with_child(
            b.container(&encoder, "encoder_embedding", "Phi4MultimodalAudioMeanVarianceNormLayer")
                .with_tensor(Tensor::buffer("global_mean", &[a.input], b.dtype, true))
                .with_tensor(Tensor::buffer("global_invstd", &[a.input], b.dtype, true)),
        )
        .with_child(embed)
        .with_child(bias)
        .with_child(b.module_list(&encoder, "encoders", layers));
    let width = a.hidden * a.downsample;
    b.container(parent, "audio_embed", "Phi4MultimodalAudioEmbedding")
        .with_child(b.dropout(&path, "drop"))
        .with_child(model)
        .with_child(b.linear(&path, "up_proj_for_speech", width, hidden, true))
        .with_child(b.linear(&path, "down_proj_for_speech", hidden, hidden, true))
        .with_child(b.linear(&path, "up_proj_for_vision_speech", width, hidden, true))
        .with_child(b.linear(&path, "down_proj_for_vision_speech", hidden, hidden, true))
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = sub_config(config, "vision_config")?;
    let audio = sub_config(config, "audio_config")?;

    // The decoder: Phi-3's, from the top level with the class's defaults, its classes renamed.
    let mut object = config.object().clone();
    object.insert("architectures".into(), Value::from(vec!["Phi3ForCausalLM"]));
    for (key, value) in TEXT_DEFAULTS {
        object.entry(*key).or_insert_with(|| Value::from(*value));
    }
    // `Phi4MultimodalConfig.tie_word_embeddings` defaults to false.
    object.entry("tie_word_embeddings").or_insert(Value::Bool(false));
    let mut model =
        super::llama::build(&HfConfig::from_object(object, config.origin()), "Phi3ForCausalLM", options)?;
    model.root.visit_mut(&mut |m| {
        if let Some((_, new)) = CLASSES.iter().find(|(old, _)| m.class == *old) {
            m.class = (*new).into();
        }
    });
    model.root.class = arch.into();
    model.architecture = arch.into();
    model.facts.model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "phi4_multimodal".into());
    model.facts.no_split_classes = match options.naming {
        Naming::V5 => vec!["Phi4MultimodalDecoderLayer".into()],
        Naming::V4 => vec![
            "Phi4MultimodalAudioConformerEncoderLayer".into(),
            "Phi4MultimodalDecoderLayer".into(),
            "Phi4MultimodalVisionEncoderLayer".into(),
        ],
    };

    // The image and audio encoders under `model.embed_tokens_extend`.
    let b = Builder::new(model.dtype, options.naming);
    let hidden = model.facts.hidden_size;
    let v = TowerSizes::read(&vision, VISION_DEFAULTS, VISION_KEYS)?;
    let image_size = vision.positive_or(&["image_size"], 448)?;
    let crop_size = vision.positive_or(&["crop_size"], 448)?;
    if image_size / v.patch == 0 || !v.hidden.is_multiple_of(v.heads) {
        return Err(InputError::new(
            vision.origin(),
            format!(
                "a tower of {} patches a side and {} heads over width {}",
                image_size / v.patch,
                v.heads,
                v.hidden
            ),
        )
        .with_fix("give the published vision_config (image_size 448, patch_size 14, 16 heads of 72)"));
    }
    let a = AudioSizes::read(&audio)?;
    let extend = "model.embed_tokens_extend";
    let (image, layers) = image_embed(&b, extend, &v, image_size, hidden);
    let embed_tokens_extend = b
        .container("model", "embed_tokens_extend", "Phi4MultimodalFeatureEmbedding")
        .with_child(image)
        .with_child(audio_embed(&b, extend, &a, hidden));
    let Some(base) = model.root.children.iter_mut().find(|m| m.path == "model") else {
        return Err(InputError::new(config.origin(), "the Phi-3 decoder has no `model`"));
    };
    base.children.push(b.dropout("model", "embed_dropout"));
    base.children.push(embed_tokens_extend);

    // The tower's facts: each crop (and the global image) is its own 448 × 448 sequence
    // (`image_pixel_values` `[batch, crops, 3, 448, 448]` flattened to `batch × crops` images),
    // the processor's crops ([`crate::model::vision::ImageTokens::tiles`]).
    let processor = ImageProcessor::DynamicHd { crop: crop_size, max_crops: DEFAULT_DYNAMIC_HD };
    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_pytorch_tanh".into());
    let tower = format!("{extend}.image_embed.img_processor");
    // The audio embedding never runs on images and text.
    let vision_facts = VisionFacts {
        idle_paths: vec![format!("{extend}.audio_embed")],
        runs_first: Some(format!("{extend}.image_embed")),
        ..v.facts(&tower, processor, 1, 2, activation)
    };
    vision_facts.attach(&mut model.facts, &layers, v.depth);
    Ok(model)
}
