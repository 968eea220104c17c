"""A method defined outside the library, through its public API only: one layer file and one ``register_method``.

It runs apply → save → native load → decompress in a process with the library, then loads the checkpoint with
``trust_remote_code`` in a process without it. Both run in child processes, so this method never joins the registry
of the test session.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run_without_library

#: The method's layer: shipped inside its checkpoints, so it imports torch and the library's public names only.
LAYER_FILE = '''
"""Sign-and-scale projections: sign(W) with one scale per output row (a toy 1-bit method)."""
import torch
import torch.nn.functional as F
from torch import nn

from hf_tensorcompress import CompressedLinear


class SignLinear(CompressedLinear):
    layer_type = "test_sign_linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.signs = nn.Parameter(torch.empty(out_features, in_features))
        self.scale = nn.Parameter(torch.empty(out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.signs.copy_(torch.sign(torch.randn_like(self.signs)))
            self.scale.fill_(1.0 / self.in_features ** 0.5)
            if self.bias is not None:
                self.bias.zero_()

    @classmethod
    def from_spec(cls, spec: dict) -> "SignLinear":
        return cls(spec["in_features"], spec["out_features"], spec["bias"])

    def dense_weight(self) -> torch.Tensor:
        return self.signs * self.scale[:, None]

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        return tokens * self.in_features * self.out_features, "sign"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense_weight(), self.bias)
'''

#: The rest of the method (config, targets, build, registration) and the checks, run with the library.
WITH_LIBRARY = """
import json, sys
from dataclasses import dataclass
from typing import ClassVar
import torch
from torch import nn
from transformers import PatchTSTConfig, PatchTSTForPrediction

sys.path.insert(0, {folder!r})
from sign_layer import SignLinear
from hf_tensorcompress import CompressionConfig, Method, apply_compression, decompress, register_method


@dataclass
class SignConfig(CompressionConfig):
    method: str = "sign"
    method_name: ClassVar[str] = "sign"


def build(model, name, linear, config, calibration=None):
    layer = SignLinear(linear.in_features, linear.out_features, linear.bias is not None)
    with torch.no_grad():
        layer.signs.copy_(torch.sign(linear.weight))
        layer.scale.copy_(linear.weight.abs().mean(dim=1))
        if linear.bias is not None:
            layer.bias.copy_(linear.bias)
    return layer


def query_projections(model):
    return [name for name, module in model.named_modules() if name.endswith("q_proj")]


method = register_method(Method("sign", SignConfig, query_projections, build, accepts=(nn.Linear,), layers=(SignLinear,)))
register_method(method)  # the very same method again: nothing changes
try:  # another method under the same name is refused
    register_method(Method("sign", SignConfig, query_projections, lambda *args: None, accepts=(nn.Linear,),
                           layers=(SignLinear,)))
    duplicate = "accepted"
except ValueError as error:
    duplicate = str(error)

torch.manual_seed(0)
config = PatchTSTConfig(num_input_channels=3, context_length=32, prediction_length=8, patch_length=8, patch_stride=8,
                        d_model=16, num_attention_heads=2, num_hidden_layers=2, ffn_dim=32)
model = apply_compression(PatchTSTForPrediction(config).eval(), CompressionConfig(method="sign"))
inputs = torch.randn(2, 32, 3)
with torch.no_grad():
    expected = model(past_values=inputs).prediction_outputs
model.save_pretrained({checkpoint!r})
native = PatchTSTForPrediction.from_pretrained({checkpoint!r}).eval()
with torch.no_grad():
    native_out = native(past_values=inputs).prediction_outputs
    dense_out = decompress(native)(past_values=inputs).prediction_outputs
torch.save({{"inputs": inputs, "expected": expected}}, {folder!r} + "/io.pt")
print(json.dumps({{
    "duplicate": duplicate,
    "layers": sorted({{type(m).__name__ for m in model.modules() if type(m).__name__ == "SignLinear"}}),
    "native": (native_out - expected).abs().max().item(),
    "dense": (dense_out - expected).abs().max().item(),
    "dense_class": type(native).__name__,
}}))
"""


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_a_method_defined_outside_the_library_saves_loads_and_ships(tmp_path):
    (tmp_path / "sign_layer.py").write_text(LAYER_FILE)
    checkpoint = tmp_path / "checkpoint"
    script = WITH_LIBRARY.format(folder=str(tmp_path), checkpoint=str(checkpoint))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["layers"] == ["SignLinear"]
    assert "already registered" in report["duplicate"]
    assert report["native"] == 0.0 and report["dense"] < 1e-5 and report["dense_class"] == "PatchTSTForPrediction"
    shipped = {path.name for path in checkpoint.glob("*.py")}
    assert "sign_layer.py" in shipped and not {"cp_layer.py", "tt_layer.py"} & shipped
    assert "from .contract import CompressedLinear" in (checkpoint / "sign_layer.py").read_text()

    result = run_without_library(
        f"""
        import torch
        from transformers import AutoModel
        io = torch.load("{tmp_path / "io.pt"}")
        model = AutoModel.from_pretrained("{checkpoint}", trust_remote_code=True).eval()
        with torch.no_grad():
            out = model(past_values=io["inputs"]).prediction_outputs
        print(type(model).__name__, (out - io["expected"]).abs().max().item())
    """,
        cwd=tmp_path,
    )
    name, difference = result.stdout.strip().splitlines()[-1].split()
    assert name == "CompressedPatchTSTForPrediction" and float(difference) == 0.0
