"""The reference tracer (trace.py) for vision-language models: Qwen2.5-VL's, Gemma 3's and
Qwen3-VL's training steps and prefills with images, under PyTorch's FakeTensorMode, recorded as
trace.py records them (its `trace()`), with an `images` key per record, in
fixtures/reference/trace/vlm-v5.json. What each family needs besides the Qwen2.5-VL notes below
is with its `…Prepared` class (Gemma 3: the fixed-size processor, `token_type_ids`, the
placeholder mask; Qwen3-VL: `vision_utils`' index tensors, the DeepStack positions); SigLIP's
weight initialisation is skipped (it reads a scalar; initialising in place allocates nothing).

FakeTensorMode has no values, and the model reads a few of its index tensors' values (the image
grids, the windows' and images' cumulative lengths, the placeholder mask, the 3-D rotary
positions). The tracer computes those from the real grids before the step, exactly as
transformers 5.x does (its own functions, called on real tensors), and hands them in:
- `get_vision_position_ids`, `get_vision_attention_seqlens`, `get_vision_window_index`: called on
  the real grid outside the fake mode and returned as they are;
- the vision attention's non-flash branch splits q, k and v at the chunks' lengths
  (`lengths.tolist()`); the tracer runs that same branch with the lengths taken from the real
  `cu_seqlens` (full-attention blocks: per image; windowed: per window);
- `get_image_features` splits the merger's output per image with the real sizes;
- `get_placeholder_mask` and `get_rope_index` (the 3-D positions) from the real token ids.
Nothing the step allocates is changed: every tensor it makes is made by transformers' code.
The batch (`pixel_values` above all, float32) stays referenced through the whole step and the
optimizer's, as the HF Trainer's loop holds `inputs` until the next batch replaces it
(trace.py's text-only steps drop theirs after the forward; their ids are a few KiB).

The prompt is what Qwen2.5-VL's chat template and processor make: per image `<|vision_start|>`,
the image's `<|image_pad|>` tokens, `<|vision_end|>`, then text; `seq` counts every token but
the image pads (vramplan's `--seq`: the image's tokens come on top, its two markers are text). Images are resized by the
processor's `smart_resize` with the published preprocessor_config.json bounds (min_pixels 3136,
max_pixels 12845056).

Usage: scripts/reference/.venv5/bin/python scripts/reference/trace_vlm.py [--print] [--only MODEL]
"""

import argparse
import json
import math
import sys
import time
import traceback

import common
import torch
import trace as tracer
from torch._subclasses.fake_tensor import unset_fake_temporarily
from transformers import vision_utils
from transformers import masking_utils
from transformers.models.gemma3 import modeling_gemma3 as gemma3
from transformers.models.llama4 import modeling_llama4 as llama4
from transformers.models.mistral3 import modeling_mistral3 as mistral3
from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3
from transformers.models.siglip import modeling_siglip as siglip

MIN_PIXELS, MAX_PIXELS = 3136, 12845056
# Qwen3-VL-8B-Instruct's preprocessor_config.json (`size.shortest_edge`, `size.longest_edge`).
QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS = 65536, 16777216

CONFIGS = [
    {"model": "qwen2.5-vl-7b-instruct", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 2, "width": 448, "height": 448}},
    {"model": "qwen2.5-vl-7b-instruct", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 2,
     "seq": 256, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "qwen2.5-vl-7b-instruct", "mode": "train", "finetune": "full", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 1, "width": 896, "height": 896}},
    {"model": "qwen2.5-vl-7b-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 2, "width": 1024, "height": 1024}},
    {"model": "qwen2.5-vl-7b-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 64, "images": {"per_sample": 4, "width": 1344, "height": 1344}},
]
# Gemma 3 4B: every image is resized to 896 × 896 whatever its size, and gives 256 tokens.
CONFIGS += [
    {"model": "gemma-3-4b-it", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 2, "width": 896, "height": 896}},
    {"model": "gemma-3-4b-it", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 2,
     "seq": 512, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "gemma-3-4b-it", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 2, "width": 896, "height": 896}},
    {"model": "gemma-3-4b-it", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 2,
     "seq": 64, "images": {"per_sample": 4, "width": 640, "height": 480}},
]
# Qwen3-VL 8B: 16-pixel patches, smart_resize into the published [65536, 16777216] pixels.
CONFIGS += [
    {"model": "qwen3-vl-8b-instruct", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 2, "width": 640, "height": 480}},
    {"model": "qwen3-vl-8b-instruct", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 2,
     "seq": 256, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "qwen3-vl-8b-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 2, "width": 1024, "height": 1024}},
    {"model": "qwen3-vl-8b-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 64, "images": {"per_sample": 1, "width": 1920, "height": 1080}},
]
# Mistral Small 3.1 24B: Pixtral's longest-edge resize (1540), a break token per row of
# tokens, and every image of the batch in one tower sequence under a block-diagonal mask.
CONFIGS += [
    {"model": "mistral-small-3.1-24b-instruct", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "mistral-small-3.1-24b-instruct", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 1,
     "seq": 512, "images": {"per_sample": 2, "width": 1540, "height": 1540}},
    {"model": "mistral-small-3.1-24b-instruct", "mode": "inference", "finetune": "none", "ckpt": False,
     "batch": 1, "seq": 128, "images": {"per_sample": 2, "width": 1540, "height": 1540}},
    {"model": "mistral-small-3.1-24b-instruct", "mode": "inference", "finetune": "none", "ckpt": False,
     "batch": 2, "seq": 64, "images": {"per_sample": 1, "width": 800, "height": 600}},
    # Four large images: the tower's block mask (48,400² values) makes the step's peak.
    {"model": "mistral-small-3.1-24b-instruct", "mode": "inference", "finetune": "none", "ckpt": False,
     "batch": 1, "seq": 32, "images": {"per_sample": 4, "width": 1540, "height": 1540}},
]
# Llama 4 Scout: 336-pixel tiles (up to 16 and a global tile), each its own tower sequence with
# a class token, pixel-shuffled to 144 tokens a tile; bfloat16 pixel values. The full model's
# weights (203 GiB) dwarf the step, so the images' share is checked on Scout with 4 of its 48
# text layers (`config`: the published config with `text_config` cut to its first 4 layers),
# where the image tokens' activations are up to half the peak. Every peak is in the text model
# (each MoE layer runs all 16 experts on every token), none in the tower.
def _scout_layers(layers):
    raw = common.load_raw_config("llama-4-scout-17b-16e")
    text = dict(raw["text_config"])
    text.update({"num_hidden_layers": layers, "moe_layers": text["moe_layers"][:layers],
                 "no_rope_layers": text["no_rope_layers"][:layers]})
    return {**raw, "text_config": text}


CONFIGS += [
    {"model": "llama-4-scout-17b-16e", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "llama-4-scout-17b-16e", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 1,
     "seq": 256, "images": {"per_sample": 2, "width": 640, "height": 480}, "config": _scout_layers(4)},
    {"model": "llama-4-scout-17b-16e", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 1, "width": 1024, "height": 1024}, "config": _scout_layers(4)},
    {"model": "llama-4-scout-17b-16e", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 2,
     "seq": 64, "images": {"per_sample": 2, "width": 1344, "height": 1344}, "config": _scout_layers(4)},
]
for c in CONFIGS:
    c.update({"dtype": "bf16"})
    if c["finetune"] == "lora":
        c.update({"lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]})
# Phi-4 multimodal: dynamic HD crops of 448 pixels (up to 36 and a global image), each its own
# tower sequence; LoRA on the decoder's fused `qkv_proj` and `o_proj` (PEFT's `q_proj`/`v_proj`
# would wrap only the tower's and the audio encoder's attention; `o_proj` also names the audio
# encoder's, which never runs on images).
PHI4 = [
    {"model": "phi-4-multimodal-instruct", "mode": "train", "finetune": "lora", "ckpt": False, "batch": 1,
     "seq": 256, "images": {"per_sample": 1, "width": 640, "height": 480}},
    {"model": "phi-4-multimodal-instruct", "mode": "train", "finetune": "lora", "ckpt": True, "batch": 2,
     "seq": 256, "images": {"per_sample": 1, "width": 1024, "height": 768}},
    {"model": "phi-4-multimodal-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 128, "images": {"per_sample": 2, "width": 1024, "height": 1024}},
    {"model": "phi-4-multimodal-instruct", "mode": "inference", "finetune": "none", "ckpt": False, "batch": 1,
     "seq": 64, "images": {"per_sample": 1, "width": 1920, "height": 1080}},
]
for c in PHI4:
    c.update({"dtype": "bf16"})
    if c["finetune"] == "lora":
        c.update({"lora_rank": 16, "lora_targets": ["qkv_proj", "o_proj"]})
CONFIGS += PHI4


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """transformers' `smart_resize` (models/qwen2_vl/image_processing_qwen2_vl.py, 5.24), whose
    module needs torchvision to import."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class Prepared:
    """One configuration's batch as its family's processor makes it, and the real index tensors
    the step reads the values of. Every family's batch has the prompt's token ids (per sample,
    each image's tokens, then the text), the image tokens' mask, `tokens_per_image` and
    `pixel_shape`; its subclass sizes the images, writes an image's tokens and adds its own
    inputs (`extra_inputs`)."""

    def __init__(self, config, hf_config):
        self.count = config["batch"] * config["images"]["per_sample"]

    def _prompt(self, config, image, image_id, markers):
        """Each sample's ids: `image` (one image's tokens) for every image, then the text tokens
        (id 100): `seq` less the `markers` tokens of each image that count as text; and the mask
        of the `image_id` tokens."""
        per_sample = config["images"]["per_sample"]
        row = image * per_sample + [100] * (config["seq"] - markers * per_sample)
        self.ids = torch.tensor([row] * config["batch"])
        self.image_mask = self.ids == image_id

    def extra_inputs(self, device):
        """The step's inputs besides `input_ids`, `pixel_values` and `labels`."""
        return {}


def _lengths(*cu_seqlens):
    """The chunks' lengths of each of `cu_seqlens`, by the tensor's length (what the attention
    forwards look them up by)."""
    return {len(cu): (cu[1:] - cu[:-1]).tolist() for cu in cu_seqlens}


class QwenPrepared(Prepared):
    """Qwen2.5-VL's batch: the grids from `smart_resize` (bounds `PIXELS`), the prompt
    (`<|vision_start|>`, the image's `<|image_pad|>` tokens, `<|vision_end|>`), and the real
    index tensors of transformers 5.24's `vision_utils` (the rotary positions, the images'
    cumulative lengths, the windows), the 3-D rotary positions (`get_rope_index`) and the split
    sizes of the merger's output."""

    MODEL = qwen.Qwen2_5_VLModel
    PIXELS = (MIN_PIXELS, MAX_PIXELS)

    def __init__(self, config, hf_config):
        super().__init__(config, hf_config)
        v = hf_config.vision_config
        images = config["images"]
        factor = v.patch_size * v.spatial_merge_size
        h, w = smart_resize(images["height"], images["width"], factor, *self.PIXELS)
        gh, gw = h // v.patch_size, w // v.patch_size
        self.tokens_per_image = gh * gw // v.spatial_merge_size**2
        self.grid = torch.tensor([[1, gh, gw]] * self.count)
        self.pixel_shape = (self.count * gh * gw, v.in_channels * v.temporal_patch_size * v.patch_size**2)
        image = [hf_config.vision_start_token_id] + [hf_config.image_token_id] * self.tokens_per_image
        image += [hf_config.vision_end_token_id]
        self._prompt(config, image, hf_config.image_token_id, markers=2)
        self.mm_types = self.image_mask.int()
        self.vision_position_ids = vision_utils.get_vision_position_ids(self.grid, v.spatial_merge_size)
        self.cu_seqlens, self.max_seqlen = vision_utils.get_vision_attention_seqlens(self.grid, v)
        self._index_tensors(v)
        self.split_sizes = (self.grid.prod(-1) // v.spatial_merge_size**2).tolist()
        model = self.MODEL.__new__(self.MODEL)
        torch.nn.Module.__init__(model)
        model.config = hf_config
        model.rope_deltas = None
        self.position_ids, _ = self.MODEL.get_rope_index(model, self.ids, self.mm_types, self.grid)

    def _index_tensors(self, v):
        """The windows' order and cumulative lengths, and the chunks' lengths."""
        self.window_index, self.cu_window_seqlens = vision_utils.get_vision_window_index(
            self.grid, spatial_merge_size=v.spatial_merge_size, window_size=v.window_size,
            patch_size=v.patch_size)
        self.lengths = _lengths(self.cu_seqlens, self.cu_window_seqlens)

    def extra_inputs(self, device):
        return {"image_grid_thw": self.grid.to(device), "position_ids": self.position_ids.to(device)}


class GemmaPrepared(Prepared):
    """Gemma 3's batch: each image resized to the processor's fixed size (`Gemma3ImageProcessor`,
    `size` 896 × 896, pan-and-scan off as published), `mm_tokens_per_image` tokens an image; the
    prompt per image is `<start_of_image>`, the image's tokens, `<end_of_image>` (what
    `Gemma3Processor` writes, the newlines around them being text), and `token_type_ids` 1 on
    the image tokens, as the processor returns them (the model's bidirectional image mask)."""

    def __init__(self, config, hf_config):
        super().__init__(config, hf_config)
        v = hf_config.vision_config
        self.tokens_per_image = hf_config.mm_tokens_per_image
        self.pixel_shape = (self.count, v.num_channels, v.image_size, v.image_size)
        image_id = hf_config.image_token_id
        image = [hf_config.boi_token_index] + [image_id] * self.tokens_per_image + [hf_config.eoi_token_index]
        self._prompt(config, image, image_id, markers=2)
        self.token_type_ids = self.image_mask.long()

    def extra_inputs(self, device):
        return {"token_type_ids": self.token_type_ids.to(device)}


def _gemma_placeholder_mask(self, input_ids, inputs_embeds, image_features):
    """`Gemma3Model.get_placeholder_mask` with the real mask (it counts the image tokens)."""
    return PREPARED.image_mask.to(inputs_embeds.device).unsqueeze(-1)


class Qwen3Prepared(QwenPrepared):
    """Qwen3-VL's batch, as Qwen2.5-VL's with 16-pixel patches and the published bounds, no
    windows, and besides `vision_utils`' position embeddings' bilinear gather and the image
    tokens' positions (DeepStack adds its features there)."""

    MODEL = qwen3.Qwen3VLModel
    PIXELS = (QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS)

    def _index_tensors(self, v):
        """The video mask (none), the image tokens' positions, the bilinear gather, and the
        chunks' lengths."""
        self.video_mask = torch.zeros_like(self.image_mask)
        self.visual_index = self.image_mask.nonzero(as_tuple=True)
        side = int(v.num_position_embeddings**0.5)
        self.interp = vision_utils.get_vision_interpolation_indices_and_weights(
            self.grid, num_grid_per_side=side, mode="bilinear", align_corners=True,
            spatial_merge_size=v.spatial_merge_size)
        self.lengths = _lengths(self.cu_seqlens)


def _vision_attention_forward(module):
    """`Qwen2_5_VLVisionAttention.forward` and `Qwen3VLVisionAttention.forward` of transformers
    5.24 (the same code, each with its `module`'s functions), their non-flash branch, with the
    chunks' lengths read from the real `cu_seqlens` of the same length."""

    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
        seq_length = hidden_states.shape[0]
        query_states, key_states, value_states = (
            self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        )
        cos, sin = position_embeddings
        query_states, key_states = module.apply_rotary_pos_emb_vision(query_states, key_states, cos, sin)
        query_states = query_states.transpose(0, 1).unsqueeze(0)
        key_states = key_states.transpose(0, 1).unsqueeze(0)
        value_states = value_states.transpose(0, 1).unsqueeze(0)
        attention_interface = module.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, module.eager_attention_forward)
        lengths = PREPARED.lengths[cu_seqlens.shape[0]]
        splits = [torch.split(t, lengths, dim=2) for t in (query_states, key_states, value_states)]
        attn_outputs = [
            attention_interface(self, q, k, v, attention_mask=None, scaling=self.scaling,
                                dropout=0.0 if not self.training else self.attention_dropout, is_causal=False,
                                **kwargs)[0]
            for q, k, v in zip(*splits)
        ]
        attn_output = torch.cat(attn_outputs, dim=1)
        attn_output = attn_output.reshape(seq_length, -1).contiguous()
        return self.proj(attn_output)

    return forward


def _qwen3_image_features(self, pixel_values, image_grid_thw=None, **kwargs):
    """`Qwen3VLModel.get_image_features` with the real split sizes."""
    pixel_values = pixel_values.type(self.visual.dtype)
    vision_output = self.visual(pixel_values, grid_thw=image_grid_thw, **{"return_dict": True, **kwargs})
    vision_output.pooler_output = torch.split(vision_output.pooler_output, PREPARED.split_sizes)
    vision_output.deepstack_features = [
        torch.split(feat, PREPARED.split_sizes) for feat in vision_output.deepstack_features
    ]
    return vision_output


def _qwen3_placeholder_mask(self, input_ids, inputs_embeds, image_features=None, video_features=None):
    image = PREPARED.image_mask.to(inputs_embeds.device).unsqueeze(-1).expand_as(inputs_embeds)
    video = PREPARED.video_mask.to(inputs_embeds.device).unsqueeze(-1).expand_as(inputs_embeds)
    return image, video


def _qwen3_deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
    """`Qwen3VLTextModel._deepstack_process`, the boolean mask's positions (what indexing by it
    computes first) taken from the real mask."""
    index = tuple(i.to(hidden_states.device) for i in PREPARED.visual_index)
    visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    hidden_states = hidden_states.clone()
    local_this = hidden_states[index + (slice(None),)] + visual_embeds
    hidden_states[index + (slice(None),)] = local_this
    return hidden_states


class PixtralPrepared(Prepared):
    """Mistral 3's batch: `PixtralImageProcessor`'s resize (the longer side to at most
    `size.longest_edge` 1540, as published, each side then rounded up to 28 pixels), pixel values
    `[images, 3, H, W]` with `image_sizes` as plain numbers (the tower slices each image's patches
    by them), and the prompt `PixtralProcessor` writes: per row of tokens `[IMG]` × columns and
    `[IMG_BREAK]`, the last one `[IMG_END]`; `seq` counts the text tokens only."""

    LONGEST_EDGE = 1540

    def __init__(self, config, hf_config):
        super().__init__(config, hf_config)
        v = hf_config.vision_config
        images = config["images"]
        h, w = images["height"], images["width"]
        ratio = max(h / self.LONGEST_EDGE, w / self.LONGEST_EDGE)
        if ratio > 1:
            h, w = int(math.floor(h / ratio)), int(math.floor(w / ratio))
        step = v.patch_size * hf_config.spatial_merge_size
        rows, cols = (h - 1) // step + 1, (w - 1) // step + 1
        self.tokens_per_image = rows * cols
        self.pixel_shape = (self.count, v.num_channels, rows * step, cols * step)
        self.image_sizes = [[rows * step, cols * step]] * self.count
        self.split_sizes = [rows * cols] * self.count
        image_id, break_id, end_id = hf_config.image_token_id, 12, 13
        image = ([image_id] * cols + [break_id]) * rows
        image[-1] = end_id
        self._prompt(config, image, image_id, markers=0)

    def extra_inputs(self, device):
        return {"image_sizes": self.image_sizes}


def _mistral3_image_features(self, pixel_values, image_sizes, vision_feature_layer=None, **kwargs):
    """`Mistral3Model.get_image_features` of transformers 5.24 (under its decorators, which ask
    the tower for the hidden state of `vision_feature_layer`), with the real split sizes."""
    kwargs.setdefault("output_hidden_states", vision_feature_layer)
    image_outputs = self.vision_tower(pixel_values, image_sizes=image_sizes, **{"return_dict": True, **kwargs})
    selected = image_outputs.hidden_states[vision_feature_layer]
    image_features = self.multi_modal_projector(selected.squeeze(0), image_sizes)
    image_outputs.pooler_output = torch.split(image_features.squeeze(0), PREPARED.split_sizes)
    return image_outputs


def _mistral3_placeholder_mask(self, input_ids, inputs_embeds, image_features):
    return PREPARED.image_mask.to(inputs_embeds.device).unsqueeze(-1).expand_as(inputs_embeds)


class Llama4Prepared(Prepared):
    """Llama 4's batch: `Llama4ImageProcessor`'s canvas (its own `find_supported_resolutions` and
    `get_best_fit`, 336-pixel tiles, `max_patches` 16, as the class defaults), its tiles and a
    global tile where there is more than one, pixel values `[tiles, 3, 336, 336]` in bfloat16
    (its `rescale_and_normalize`); the prompt `Llama4Processor._prompt_split_image` writes:
    `<|image_start|>`, per row the tiles' `<|patch|>` tokens with `<|tile_x_separator|>` between
    them and `<|tile_y_separator|>` after, `<|image|>`, the global tile's patches,
    `<|image_end|>`; `seq` counts the text tokens only."""

    def __init__(self, config, hf_config):
        super().__init__(config, hf_config)
        from transformers.image_utils import SizeDict
        from transformers.models.llama4 import image_processing_llama4 as processing
        v = hf_config.vision_config
        images = config["images"]
        tile = SizeDict(height=v.image_size, width=v.image_size)
        possible = torch.tensor(processing.find_supported_resolutions(max_num_chunks=16, patch_size=tile))
        canvas = processing.get_best_fit((images["height"], images["width"]), possible)
        rows, cols = int(canvas[0]) // v.image_size, int(canvas[1]) // v.image_size
        tiles = rows * cols + (1 if rows * cols > 1 else 0)
        # `Llama4Processor`: `downsample_ratio = int(round(1.0 / pixel_shuffle_ratio**2))`.
        per_tile = (v.image_size // v.patch_size) ** 2 // int(round(1.0 / v.pixel_shuffle_ratio ** 2))
        self.pixel_shape = (self.count * tiles, v.num_channels, v.image_size, v.image_size)
        self.pixel_dtype = torch.bfloat16
        patch_id, x_sep, y_sep, image_mark = hf_config.image_token_index, 12, 13, 14
        image = [hf_config.boi_token_index]
        if rows * cols > 1:
            for _ in range(rows):
                for x in range(cols):
                    image += [patch_id] * per_tile + ([x_sep] if x < cols - 1 else [])
                image.append(y_sep)
        image += [image_mark] + [patch_id] * per_tile + [hf_config.eoi_token_index]
        self.tokens_per_image = len(image)
        self._prompt(config, image, patch_id, markers=0)


def _llama4_placeholder_mask(self, input_ids, inputs_embeds, image_features):
    return PREPARED.image_mask.to(inputs_embeds.device).unsqueeze(-1)


class Phi4Prepared(Prepared):
    """Phi-4 multimodal's batch as `Phi4MultimodalImageProcessor` (transformers 5.24, dynamic_hd
    36 as published, 448-pixel crops) makes it from a blank image of the configured size, run for
    real: `image_pixel_values` `[images, crops, 3, 448, 448]` (float32), `image_sizes` (the canvas),
    `image_attention_mask` `[images, crops, 32, 32]` (float32), and `num_img_tokens` image tokens
    (`<|endoftext10|>`, what `Phi4MultimodalProcessor.replace_image_token` writes) an image; `seq`
    counts the text tokens only. The values the image embedding reads from tensors (the canvas
    in crops, the useful rows and columns of each image's pooled mask, the image tokens'
    positions) are taken from the real output."""

    def __init__(self, config, hf_config):
        super().__init__(config, hf_config)
        from PIL import Image
        from transformers.models.phi4_multimodal.image_processing_phi4_multimodal import (
            Phi4MultimodalImageProcessor)
        images = config["images"]
        out = Phi4MultimodalImageProcessor(dynamic_hd=36)(
            Image.new("RGB", (images["width"], images["height"])), return_tensors="pt")
        v = hf_config.vision_config
        crops = out["image_pixel_values"].shape[1]
        self.canvas = [int(x) for x in out["image_sizes"][0]]
        self.mask = out["image_attention_mask"][0]
        self.mask_all = bool(self.mask.all())
        self.tokens_per_image = int(out["num_img_tokens"][0])
        self.pixel_shape = (self.count, crops, v.num_channels, v.crop_size, v.crop_size)
        # `Phi4MultimodalImageEmbedding.forward`'s useful height and width of the crops' pooled mask.
        h, w = self.canvas[0] // v.crop_size, self.canvas[1] // v.crop_size
        base = v.image_size // v.patch_size // 2
        pooled = (self.mask[1 : h * w + 1, 0::2, 0::2].reshape(h, w, base, base).transpose(1, 2)
                  .reshape(1, h * base, w * base))
        self.useful = (int(pooled[0, :, 0].sum().item()), int(pooled[0, 0, :].sum().item()))
        self._prompt(config, [v.image_token_id] * self.tokens_per_image, v.image_token_id, markers=0)
        self.positions = torch.nonzero(self.ids == v.image_token_id, as_tuple=True)

    def extra_inputs(self, device):
        return {"image_sizes": torch.tensor([self.canvas] * self.count, device=device),
                "image_attention_mask": torch.ones(self.count, *self.mask.shape, device=device)}


def _phi4_causal_lm_forward(forward):
    """`Phi4MultimodalForCausalLM.forward` taking the batch's `pixel_values` as its
    `image_pixel_values` (the same tensor)."""

    def wrapped(self, *args, pixel_values=None, **kwargs):
        return forward(self, *args, image_pixel_values=pixel_values, **kwargs)

    return wrapped


def _phi4_feature_embedding(self, input_ids, inputs_embeds, image_pixel_values=None, audio_input_features=None,
                            image_sizes=None, image_attention_mask=None, audio_embed_sizes=None,
                            audio_attention_mask=None):
    """`Phi4MultimodalFeatureEmbedding.forward` of transformers 5.24 for images and text: its
    position masks, its test that the ids hold image tokens (which reads a value: true here), and
    the image embedding; no audio."""
    with torch.no_grad():
        image_position_mask = (input_ids == self.config.vision_config.image_token_id).unsqueeze(-1)
        non_image_position_mask = ~image_position_mask
        any_image = input_ids == self.image_token_id
    del image_position_mask, non_image_position_mask, any_image
    return self.image_embed(input_ids, inputs_embeds, image_pixel_values=image_pixel_values,
                            image_sizes=image_sizes, image_attention_mask=image_attention_mask)


def _phi4_image_embedding(self, input_ids, inputs_embeds, image_pixel_values, image_sizes=None,
                          image_attention_mask=None):
    """`Phi4MultimodalImageEmbedding.forward` of transformers 5.24, the values it reads from
    tensors (`image_sizes`, the pooled mask's useful rows and columns, the image tokens'
    positions) taken from the real processor output (`PREPARED`); every tensor it makes, made."""
    nn = torch.nn
    image_pixel_values = image_pixel_values.to(self.img_processor.embeddings.patch_embedding.weight.dtype)
    target_device = self.img_projection_up.bias.device
    target_dtype = self.img_projection_up.bias.dtype
    batch_size = image_pixel_values.shape[0]
    img_features = self.get_img_features(
        image_pixel_values.flatten(0, 1),
        attention_mask=image_attention_mask.flatten(0, 1).to(dtype=bool, device=target_device),
    )
    base_feat_size = int(math.sqrt(img_features.shape[1]))
    img_features = img_features.view(batch_size, -1, base_feat_size**2, self.image_dim_out)
    image_sizes = image_sizes.view(-1, 2)
    output_imgs = []
    for idx in range(batch_size):
        height, width = PREPARED.canvas
        height_ratio = height // self.crop_size
        width_ratio = width // self.crop_size
        area_ratio = height_ratio * width_ratio
        global_img = img_features[idx, :1]
        global_img = global_img.reshape(1, base_feat_size, base_feat_size, self.image_dim_out).contiguous()
        temporary_extensor = self.sub_img_feature_extensor.repeat(1, base_feat_size, 1, 1)
        global_img = torch.cat([global_img, temporary_extensor], dim=2).reshape(1, -1, self.image_dim_out)
        sub_img = img_features[idx, 1:]
        sub_img = sub_img[:area_ratio]
        sub_img = (
            sub_img.reshape(height_ratio, width_ratio, base_feat_size, base_feat_size, self.image_dim_out)
            .transpose(1, 2)
            .reshape(1, height_ratio * base_feat_size, width_ratio * base_feat_size, self.image_dim_out)
            .contiguous()
        )
        reshaped_image_attention_mask = (
            image_attention_mask[idx, 1 : area_ratio + 1, 0::2, 0::2]
            .reshape(height_ratio, width_ratio, base_feat_size, base_feat_size)
            .transpose(1, 2)
            .reshape(1, height_ratio * base_feat_size, width_ratio * base_feat_size)
        )
        del reshaped_image_attention_mask
        useful_height, useful_width = PREPARED.useful
        sub_img = sub_img[:, :useful_height, :useful_width]
        temporary_extensor = self.sub_img_feature_extensor.repeat(1, useful_height, 1, 1)
        sub_img = torch.cat([sub_img, temporary_extensor], dim=2).reshape(1, -1, self.image_dim_out)
        output_imgs.append(torch.cat([sub_img, self.global_img_feature_extensor, global_img], dim=1))
    img_set_tensor = []
    for output_img in output_imgs:
        output_img = output_img.to(device=target_device, dtype=target_dtype)
        img_feature_proj = self.img_projection_up(output_img)
        img_feature_proj = nn.functional.gelu(img_feature_proj)
        img_feature_proj = self.img_projection_down(img_feature_proj)
        img_set_tensor.append(img_feature_proj)
    merged_img_set_tensor = torch.cat(img_set_tensor, dim=1).squeeze(0)
    merged_img_set_tensor = merged_img_set_tensor.to(dtype=inputs_embeds.dtype, device=inputs_embeds.device)
    with torch.no_grad():
        positions_tuple = tuple(p.to(inputs_embeds.device) for p in PREPARED.positions)
    with phi4.maybe_autocast(device_type=inputs_embeds.device.type, enabled=False):
        image_embeds = inputs_embeds.index_put(indices=positions_tuple, values=merged_img_set_tensor, accumulate=False)
    image_embeds = self.drop(image_embeds)
    return image_embeds


_BIDIRECTIONAL_SKIP = masking_utils._ignore_bidirectional_mask_sdpa


def _phi4_bidirectional_skip(padding_mask, kv_length, local_attention_size=None):
    """`masking_utils._ignore_bidirectional_mask_sdpa` (5.24) for Phi-4's tower, whose patch mask
    (the crops' `image_attention_mask`) it tests with `padding_mask.all()`: the real mask's value
    (false where the canvas pads the image by a patch or more: the mask is then made)."""
    if isinstance(PREPARED, Phi4Prepared) and padding_mask is not None:
        return PREPARED.mask_all and (local_attention_size is None or kv_length < local_attention_size)
    return _BIDIRECTIONAL_SKIP(padding_mask, kv_length, local_attention_size)


PREPARED = None


def _image_features(self, pixel_values, image_grid_thw=None, **kwargs):
    pixel_values = pixel_values.type(self.visual.dtype)
    vision_outputs = self.visual(pixel_values, grid_thw=image_grid_thw, **kwargs)
    vision_outputs.pooler_output = torch.split(vision_outputs.pooler_output, PREPARED.split_sizes)
    return vision_outputs


def _placeholder_mask(self, input_ids, inputs_embeds, image_features=None, video_features=None):
    mask = PREPARED.image_mask.to(inputs_embeds.device).unsqueeze(-1).expand_as(inputs_embeds)
    return mask, torch.zeros_like(mask)


def _with_real(value):
    def patched(*args, **kwargs):
        return value()
    return patched


def _install():
    for module, attention in ((qwen, qwen.Qwen2_5_VLVisionAttention), (qwen3, qwen3.Qwen3VLVisionAttention)):
        module.get_vision_position_ids = _with_real(lambda: PREPARED.vision_position_ids)
        module.get_vision_attention_seqlens = _with_real(lambda: (PREPARED.cu_seqlens, PREPARED.max_seqlen))
        attention.forward = _vision_attention_forward(module)
    qwen.get_vision_window_index = _with_real(lambda: (PREPARED.window_index, PREPARED.cu_window_seqlens))
    qwen.Qwen2_5_VLModel.get_image_features = _image_features
    qwen.Qwen2_5_VLModel.get_placeholder_mask = _placeholder_mask
    gemma3.Gemma3Model.get_placeholder_mask = _gemma_placeholder_mask
    qwen3.get_vision_interpolation_indices_and_weights = _with_real(lambda: PREPARED.interp)
    qwen3.Qwen3VLModel.get_image_features = _qwen3_image_features
    qwen3.Qwen3VLModel.get_placeholder_mask = _qwen3_placeholder_mask
    qwen3.Qwen3VLTextModel._deepstack_process = _qwen3_deepstack_process
    mistral3.Mistral3Model.get_image_features = _mistral3_image_features
    mistral3.Mistral3Model.get_placeholder_mask = _mistral3_placeholder_mask
    llama4.Llama4ForConditionalGeneration.get_placeholder_mask = _llama4_placeholder_mask
    # transformers 5.24's `Llama4ForConditionalGeneration.forward` ends by reading
    # `outputs.image_outputs` of the language model's `MoeCausalLMOutputWithPast`, which has no
    # such field (AttributeError once the loss is computed, whatever the inputs); the tracer gives
    # the class that attribute, as None, so the step can return. It allocates nothing.
    llama4.MoeCausalLMOutputWithPast.image_outputs = None
    # SigLIP's weight initialisation (`variance_scaling_`) reads a scalar, which a fake tensor
    # has not; the values do not matter, and initialising in place allocates nothing.
    siglip.SiglipPreTrainedModel._init_weights = lambda self, module: None
    phi4.Phi4MultimodalForCausalLM.forward = _phi4_causal_lm_forward(phi4.Phi4MultimodalForCausalLM.forward)
    phi4.Phi4MultimodalFeatureEmbedding.forward = _phi4_feature_embedding
    phi4.Phi4MultimodalImageEmbedding.forward = _phi4_image_embedding
    masking_utils._ignore_bidirectional_mask_sdpa = _phi4_bidirectional_skip
    # Phi-4's weight initialisation reads scalars too (`lecun_normal_`, `default_flax_embed_init_`),
    # as SigLIP's; skipped the same way.
    for cls in (phi4.Phi4MultimodalPreTrainedModel, phi4.Phi4MultimodalVisionPreTrainedModel,
                phi4.Phi4MultimodalAudioPreTrainedModel):
        cls._init_weights = lambda self, module: None


HELD = []


def _inputs(config, vocab, device):
    HELD.clear()
    ids = torch.randint(0, vocab, PREPARED.ids.shape, device=device)
    pixel_dtype = getattr(PREPARED, "pixel_dtype", torch.float32)
    out = {"input_ids": ids, "pixel_values": torch.randn(*PREPARED.pixel_shape, device=device, dtype=pixel_dtype),
           **PREPARED.extra_inputs(device)}
    if config["mode"] == "train":
        out["labels"] = ids
    HELD.append(out)
    return out


def main():
    global PREPARED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    parser.add_argument("--only", help="trace only this model's configurations; the others' records are kept")
    args = parser.parse_args()
    configs = [c for c in CONFIGS if not args.only or c["model"] == args.only]
    out = common.FIXTURES / "trace" / f"vlm-{common.TAG}.json"
    kept = []
    if args.only and out.exists():
        kept = [r for r in json.loads(out.read_text())["records"] if r["model"] != args.only]
    prepared = {}
    for config in configs:
        raw = config.get("config") or common.load_raw_config(config["model"])
        hf_config, _ = common.make_config(raw)
        with unset_fake_temporarily():
            family = next((f for prefix, f in (("gemma-3", GemmaPrepared), ("qwen3-vl", Qwen3Prepared),
                                                    ("mistral-small-3", PixtralPrepared),
                                                    ("llama-4", Llama4Prepared),
                                                    ("phi-4-multimodal", Phi4Prepared))
                           if config["model"].startswith(prefix)), QwenPrepared)
            prepared[json.dumps(config, sort_keys=True)] = family(config, hf_config)
    # The real functions were needed for the preparation; the step gets their results.
    _install()
    tracer._inputs = _inputs
    records = []
    for config in configs:
        PREPARED = prepared[json.dumps(config, sort_keys=True)]
        start = time.time()
        try:
            record = {**config, **tracer.trace(config)}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=4)
            record = {**config, "error": common.err_str(e)}
        record["image_tokens"] = PREPARED.tokens_per_image
        record["seconds"] = round(time.time() - start, 1)
        print(json.dumps(record), file=sys.stderr, flush=True)
        records.append(record)
    if args.print:
        return
    # Records in the order of CONFIGS, those not traced now kept from the file.
    order = [json.dumps(c, sort_keys=True) for c in CONFIGS]
    def key(record):
        return json.dumps({k: record[k] for k in CONFIGS[0].keys() | {"lora_rank", "lora_targets"} if k in record},
                          sort_keys=True)
    records = sorted(kept + records, key=lambda r: order.index(key(r)) if key(r) in order else len(order))
    common.write_json(out, {"versions": common.versions(), "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
