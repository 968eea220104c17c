"""Loading a tiered checkpoint natively costs what loading it with ``trust_remote_code`` costs: a 262,144 × 640
vocabulary (the 270M class) saved with int4 rows, loaded in a new process each way; the peak resident memory of the
native load may exceed the remote-code load's by 5 % at most (nothing rebuilds the dense 671 MB table on the way)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import BLOCK_LIBRARY
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression

pytestmark = pytest.mark.journey  # two loads of a 130 MB checkpoint, each in a new process

PEAK = """
import resource, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({folder!r}, trust_remote_code={remote})
with torch.no_grad():
    model(input_ids=torch.tensor([[1, 2, 3]]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_kib(script: str) -> int:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split()[-1])


def test_native_loading_peaks_no_higher_than_remote_code(tmp_path):
    config = LlamaConfig(
        vocab_size=262_144, hidden_size=640, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=1, head_dim=160, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = apply_compression(LlamaForCausalLM(config).eval(), CompressionConfig(method="tiered", tier_bits=[4]))
    model.save_pretrained(tmp_path / "tiered")
    del model
    folder = str(tmp_path / "tiered")
    native = peak_kib("import hf_tensorcompress\n" + PEAK.format(folder=folder, remote=False))
    remote = peak_kib(BLOCK_LIBRARY + PEAK.format(folder=folder, remote=True))
    assert native <= 1.05 * remote, f"native load peaked at {native / 1024:.0f} MB, remote code at {remote / 1024:.0f}"
