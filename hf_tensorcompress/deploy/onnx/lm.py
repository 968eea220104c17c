"""The causal-LM graph: ``input_ids``, ``position_ids`` and every layer's past keys and values in; the logits of the
new positions and the grown keys and values out. The runner prefills with an empty cache (zero past positions) and
then decodes one token per call, so one graph serves both.

The cache is rebuilt inside the traced forward as a transformers ``DynamicCache`` from the input tensors, so the
model's own attention code (causal mask, rotary positions, grouped KV heads) is what the graph records.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

#: Past positions in the example the exporter traces (above 1, so the dimension is not specialised).
EXAMPLE_PAST = 3


def _cache_shape(model: nn.Module) -> tuple[int, int, int]:
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads, head_dim


class CausalLMGraph(nn.Module):
    """``(input_ids, position_ids, past_key_0, past_value_0, …)`` → ``(logits, present_key_0, present_value_0, …)``."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor) -> tuple:
        # Full-length layers even for sliding-window models (Gemma 2/3): a sliding layer rebuilt from the inputs
        # would count only the positions it holds, and the model's sliding mask is built from the positions anyway.
        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        output = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=cache,
            attention_mask=torch.ones(
                input_ids.shape[0], past[0].shape[2] + input_ids.shape[1], dtype=torch.long, device=input_ids.device
            ),
            use_cache=True,
        )
        present = []
        for layer in output.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (output.logits, *present)


def causal_lm_graph(model: nn.Module) -> tuple[nn.Module, tuple, dict, dict]:
    layers, kv_heads, head_dim = _cache_shape(model)
    batch, sequence, past = (
        torch.export.Dim("batch", min=1, max=64),
        torch.export.Dim("sequence", max=8192),
        (torch.export.Dim("past", min=0, max=8192)),
    )
    ids = torch.zeros(2, 4, dtype=torch.long)
    positions = torch.arange(EXAMPLE_PAST, EXAMPLE_PAST + 4).repeat(2, 1)
    cache_names = [f"past_{kind}_{layer}" for layer in range(layers) for kind in ("key", "value")]
    example_cache = tuple(torch.randn(2, kv_heads, EXAMPLE_PAST, head_dim) for _ in cache_names)
    dynamic = {
        "input_ids": {0: batch, 1: sequence},
        "position_ids": {0: batch, 1: sequence},
        "past": tuple({0: batch, 2: past} for _ in cache_names),
    }
    config = model.config.get_text_config()
    metadata = {
        "kind": "causal_lm",
        "architecture": type(model).__name__,
        "inputs": ["input_ids", "position_ids", *cache_names],
        "outputs": ["logits", *(name.replace("past_", "present_") for name in cache_names)],
        "cache_inputs": cache_names,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": config.vocab_size,
        "eos_token_id": config.eos_token_id,
    }
    return CausalLMGraph(model, layers), (ids, positions, *example_cache), dynamic, metadata
