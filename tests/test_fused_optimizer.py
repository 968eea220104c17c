"""Evaluation between training steps sees every step, whatever the optimizer.

Layers cache what they derive from their parameters (packed codes, a rounded or rebuilt weight, a token-minor
layout) by the parameters' version counters. A fused optimizer (``torch.optim.AdamW(fused=True)``, the Trainer's
default ``adamw_torch_fused``) writes parameters without bumping them; the library bumps them after every optimizer
step. Checked for every trainable method and storage option of the dtype matrix: after one fused step, a no-grad
forward (what the Trainer's evaluation, model selection and the byte search's reward run) equals the forward of the
stepped model saved and loaded back (no cache: the stored form), and differs from the forward before the step.
"""

from __future__ import annotations

import pytest
import torch
from test_dtype_matrix import CASES, dense, inputs_of, output_of

from hf_tensorcompress import CompressionConfig, apply_compression

#: The matrix's fp32 cases with parameters to train (the tiered embedding is training-free).
TRAINABLE = [case for case, (_, options, _) in CASES.items() if options["method"] != "tiered"]


def compressed(case: str) -> torch.nn.Module:
    family, options, _ = CASES[case]
    torch.manual_seed(0)
    return apply_compression(dense(family, torch.float32), CompressionConfig(**options))


@pytest.mark.parametrize("case", TRAINABLE)
def test_a_no_grad_forward_after_a_fused_step_uses_the_stepped_weights(case, tmp_path):
    family = CASES[case][0]
    model = compressed(case)
    inputs = inputs_of(family, model)
    model.eval()
    before = output_of(family, model, inputs)  # fills every cache
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, fused=True)
    torch.manual_seed(123)
    out = model(**inputs)
    (out.logits if family.startswith("llama") else out.prediction_outputs).pow(2).mean().backward()
    optimizer.step()
    model.eval()
    after = output_of(family, model, inputs)

    model.save_pretrained(tmp_path)
    expected = output_of(family, type(model).from_pretrained(tmp_path).eval(), inputs)
    assert not torch.allclose(after, before), "the step changed nothing: the check below would prove nothing"
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)
