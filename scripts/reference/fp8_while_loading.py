"""What transformers does with `FineGrainedFP8Config` (`--quant fp8`, quantized while loading)
on GPUs of each compute capability: its quantizer's `validate_environment` and
`_process_model_before_weight_loading` on a meta-device Llama, with `torch.cuda` answering as
a GPU of that capability (the only CUDA calls these steps make). Records, per capability,
whether the quantizer set `dequantize` and which classes the projections became (`FP8Linear`
where the weights are held in fp8, `Linear` where they load unquantized).

Writes fixtures/reference/fp8-while-loading-v5.json, read by tests/tests/fp8_while_loading.rs.
Run by scripts/reference/run fp8 (no GPU).
"""

import torch
from transformers import FineGrainedFP8Config, LlamaConfig, LlamaForCausalLM
from transformers.quantizers.auto import AutoHfQuantizer

import common

CAPABILITIES = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)]


def run(capability):
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *args, **kwargs: capability
    quantizer = AutoHfQuantizer.from_config(FineGrainedFP8Config(weight_block_size=(128, 128)), pre_quantized=False)
    quantizer.validate_environment(device_map={"": 0})
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=1000)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    quantizer._process_model_before_weight_loading(model)
    classes = sorted({type(m).__name__ for name, m in model.named_modules() if name.endswith("_proj")})
    return {"capability": f"{capability[0]}.{capability[1]}",
            "dequantize": bool(quantizer.quantization_config.dequantize), "projection_classes": classes}


def main():
    records = [run(c) for c in CAPABILITIES]
    for r in records:
        print(r)
    common.write_fixture(common.FIXTURES / "fp8-while-loading-v5.json",
                         {"versions": common.versions(), "records": records})


if __name__ == "__main__":
    main()
