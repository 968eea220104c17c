"""Gemma 3's scaled embeddings (``tt`` and ``tiered``, the lookup times √hidden) export with the scale applied: the
exported model generates PyTorch's greedy tokens."""

import pytest
from onnx_cases import exported, saved_gemma3, stored_tensors_kept, torch_greedy

from hf_tensorcompress import load_model
from hf_tensorcompress.deploy.onnx.runner import generate, load

#: no pad token (0 here): ``generate`` would mask it out of the prompt, the exported graph attends to every token
PROMPT = [3, 5, 17, 33, 8, 90]
OPTIONS = {
    "tt": {"method": "tt", "tt_order": 3, "tt_ranks": 4},
    "tiered": {"method": "tiered", "tier_tokens": [40], "tier_bits": [4, 2], "tier_group_size": 8},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONS)
def test_gemma3_greedy_tokens_match_pytorch(tmp_path, name):
    folder = saved_gemma3(tmp_path / name, OPTIONS[name])
    embedding = load_model(folder).get_input_embeddings()
    assert type(embedding).__name__.startswith("Scaled") and embedding.embed_scale > 1
    path = exported(folder)
    assert stored_tensors_kept(folder, path) == []
    expected = torch_greedy(folder, PROMPT, 16)
    assert len(set(expected)) > 1  # the tokens change, so equality says something
    assert generate(load(path, threads=1), PROMPT, 16) == expected
