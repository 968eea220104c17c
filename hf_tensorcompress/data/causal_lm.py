"""The real causal LM used for TensorSLM: SmolLM2-135M-Instruct from its GGUF, converted once to an HF folder.

transformers dequantises the Q4_1 GGUF on load (slow, and the weights are 4-bit-dequantised, not the original
bf16: say so next to any result). The converted folder (safetensors + tokenizer) is cached beside the GGUF, so
every later load is a plain ``from_pretrained(folder)``.
"""

from __future__ import annotations

from pathlib import Path

from .. import assets

WEIGHTS_NOTE = (
    "SmolLM2-135M-Instruct GGUF dequantised to float32 by transformers: block linears Q4_1 (4-bit), tied embedding "
    "token_embd.weight Q8_0 (8-bit)"
)


def converted_smollm2_dir() -> Path:
    """Where ``smollm2_dir`` keeps the converted folder (beside the GGUF's); nothing is fetched or converted."""
    fetched = assets.asset_dir("smollm2")
    return fetched.with_name(fetched.name + "-hf")


def smollm2_dir() -> Path:
    """An HF folder (config, safetensors, tokenizer) of SmolLM2-135M-Instruct, converted from the GGUF once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = assets.smollm2_gguf()
    target = converted_smollm2_dir()
    if (target / ".complete").exists():
        return target
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained (it carries a gguf quantizer); its tensors are plain float
    # already, so move them into a model built from the same config without the quantization record
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / ".complete").touch()
    return target
