"""Any module imports first in a fresh process, and transformers still learns ``quant_method="tensorcompress"``:
the registration runs while our own modules may be mid-import, so it must not need them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["hf_tensorcompress.methods.cp.layer", "hf_tensorcompress.runtime.structure"])
def test_a_module_imported_first_still_registers_the_quantizer(module):
    code = (
        f"import {module}\n"
        "import transformers.modeling_utils\n"
        "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
        "print('tensorcompress' in AUTO_QUANTIZER_MAPPING)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True"
