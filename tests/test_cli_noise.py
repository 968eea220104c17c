"""stderr carries the library's own lines and real problems, not third-party noise: torchao's kernels a CPU install
cannot load, bitsandbytes' note about a Hub kernel and torch's pytree deprecation notes are dropped once ``hf_tensorcompress`` is imported (a user's script
and the command line alike); anything else those libraries log still shows."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from helpers import save_word_level_lm
from test_cli import ROOT, cli
from transformers import LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.log_noise import NOISE, DropMatching, silence_third_party_noise

TORCHAO_LINE = "Failed to load /venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load"
BNB_LINE = "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure"
PYTREE_LINE = (
    "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an opaque value "
    "type. Calling register_constant() on Enum subclasses is deprecated and will be an error in a future release."
)


def test_a_model_loading_command_prints_no_third_party_noise(tmp_path):
    model = LlamaForCausalLM.from_pretrained(save_word_level_lm(tmp_path / "lm", 64, 32))
    apply_compression(model, CompressionConfig(method="svd", rank=4, target_modules=["q_proj"]))
    model.save_pretrained(tmp_path / "svd")
    result = cli("report", str(tmp_path / "svd"))
    assert "q_proj" in result.stdout
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr, result.stderr


def test_the_filters_drop_only_the_known_lines(caplog, monkeypatch):
    for name, _ in NOISE:  # the filters are removed again after the test
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    silence_third_party_noise()
    silence_third_party_noise()  # once per logger, however often main runs
    for name, pattern in NOISE:
        assert sum(isinstance(f, DropMatching) and f.pattern is pattern for f in logging.getLogger(name).filters) == 1
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning(TORCHAO_LINE)
        logging.getLogger("torch.utils._pytree").warning(PYTREE_LINE)
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(BNB_LINE)
        logging.getLogger("torchao").warning("Failed to quantize layer 3: shape mismatch")
        logging.getLogger("torch.utils._pytree").warning("register_constant(cls) expects a non-default __eq__")
    assert [record.getMessage() for record in caplog.records] == [
        "Failed to quantize layer 3: shape mismatch",
        "register_constant(cls) expects a non-default __eq__",
    ]


def test_importing_the_library_quiets_the_model_loads_of_a_script(tmp_path):
    """Every import printed torchao's ``Failed to load …_C_….so`` lines and torch's ``_pytree`` notes as soon as
    transformers loaded a model (torchao is imported with transformers' quantizers)."""
    model = LlamaForCausalLM.from_pretrained(save_word_level_lm(tmp_path / "lm", 64, 32))
    apply_compression(model, CompressionConfig(method="svd", rank=4, target_modules=["q_proj"]))
    model.save_pretrained(tmp_path / "svd")
    code = (
        "import sys, hf_tensorcompress, bitsandbytes\n"  # bitsandbytes noted a Hub kernel it does without
        "from transformers import AutoModelForCausalLM\n"
        "AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print('loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "svd")], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "loaded", result.stderr[-2000:]
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr, result.stderr
