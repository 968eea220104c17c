"""SmolLM2-135M with the README's 6× tiered embedding, exported: the same 32 greedy tokens as the PyTorch checkpoint,
and a file smaller than the dense export's by at least what the embedding saves (the token→row map in 16 bits pays
for the graph of the decoding ops), its tensors alone by more."""

import onnx
import pytest
import torch
from transformers import AutoTokenizer

from hf_tensorcompress import CompressionConfig, apply_compression, load_model
from hf_tensorcompress.data.causal_lm import smollm2_dir
from hf_tensorcompress.deploy.onnx import export_onnx
from hf_tensorcompress.deploy.onnx.runner import generate, load

TIERED_6X = {"method": "tiered", "tier_tokens": [2000], "tier_bits": [4, "codebook"]}


@pytest.mark.slow  # two exports of a 135M-parameter model
def test_smollm2_tiered_export(tmp_path):
    dense_folder = smollm2_dir()
    model = load_model(dense_folder).float().eval()
    embedding = model.get_input_embeddings()
    dense_embedding_bytes = embedding.weight.numel() * 4
    apply_compression(model, CompressionConfig(**TIERED_6X))
    tiered = model.get_input_embeddings()
    saving = dense_embedding_bytes - sum(b.numel() * b.element_size() for b in tiered.buffers())
    prompt = AutoTokenizer.from_pretrained(dense_folder)("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None)[0, prompt.shape[1] :]
    compressed_file = export_onnx(model, tmp_path / "tiered.onnx")
    assert generate(load(compressed_file, threads=2), prompt[0].tolist(), 32) == expected.tolist()
    dense_file = export_onnx(dense_folder, tmp_path / "dense.onnx")
    assert tensor_bytes(dense_file) - tensor_bytes(compressed_file) >= saving
    assert dense_file.stat().st_size - compressed_file.stat().st_size >= saving


def tensor_bytes(path):
    """Bytes of the file's tensors (their raw data: names, shapes, the graph's nodes and shape annotations left out)."""
    return sum(len(init.raw_data) for init in onnx.load(str(path)).graph.initializer)
