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
from transformers.models.gemma3 import modeling_gemma3 as gemma3
from transformers.models.mistral3 import modeling_mistral3 as mistral3
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
for c in CONFIGS:
    c.update({"dtype": "bf16"})
    if c["finetune"] == "lora":
        c.update({"lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]})


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
    # SigLIP's weight initialisation (`variance_scaling_`) reads a scalar, which a fake tensor
    # has not; the values do not matter, and initialising in place allocates nothing.
    siglip.SiglipPreTrainedModel._init_weights = lambda self, module: None


HELD = []


def _inputs(config, vocab, device):
    HELD.clear()
    ids = torch.randint(0, vocab, PREPARED.ids.shape, device=device)
    out = {"input_ids": ids, "pixel_values": torch.randn(*PREPARED.pixel_shape, device=device),
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
        raw = common.load_raw_config(config["model"])
        hf_config, _ = common.make_config(raw)
        with unset_fake_temporarily():
            family = next((f for prefix, f in (("gemma-3", GemmaPrepared), ("qwen3-vl", Qwen3Prepared),
                                                    ("mistral-small-3", PixtralPrepared))
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
