"""Ternary storage five codes a byte: every row width packs and decodes exactly, the bytes are 1.6 bits a weight plus
one fp16 level per group, and a checkpoint's bytes that no packing writes are refused."""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_tensorcompress.runtime.contract import TensorProblem
from hf_tensorcompress.runtime.ternary import (
    TernaryTensor,
    level_table,
    pack_trits,
    ternary_params,
    ternary_stored,
    ternary_values,
)


def test_the_level_table_holds_every_five_levels_once():
    table = level_table(torch.float32)
    assert table.shape == (243, 5)
    assert {tuple(row) for row in table.int().tolist()} == set(itertools.product((-1, 0, 1), repeat=5))


@pytest.mark.parametrize("columns", range(1, 12))
def test_every_row_width_packs_and_decodes_exactly(columns):
    torch.manual_seed(columns)
    matrix = torch.randn(7, columns)
    kept = ternary_stored(matrix, None)
    codes, scale = ternary_params(matrix, columns)
    assert kept.codes.shape == (7, -(-columns // 5)) and int(kept.codes.max()) < 243
    expected = (codes.float() - 1) * scale.float()
    assert torch.equal(kept.dequantize(), expected)
    assert torch.equal(ternary_values(matrix, None, torch.float32), expected)  # training computes what is stored
    ids = torch.tensor([6, 0, 3, 3])
    assert torch.equal(kept.rows(ids), expected[ids])
    hidden = torch.randn(2, 3, columns)
    assert torch.allclose(kept.matmul_t(hidden), hidden @ expected.T, atol=1e-6)
    assert torch.allclose(kept.matmul_t(hidden, chunk=2), hidden @ expected.T, atol=1e-6)
    kept.check_state()


def test_the_bytes_are_five_codes_a_byte_and_one_fp16_level_per_group():
    kept = ternary_stored(torch.randn(12, 64), 32)
    assert kept.storage_bits() == 12 * 13 * 8 + 12 * 2 * 16  # 13 bytes a row of 64 codes; two levels a row
    assert {name for name, _ in kept.named_buffers()} == {"codes", "scale"}


def test_codes_that_no_packing_writes_are_refused():
    kept = ternary_stored(torch.randn(3, 8), None)  # 8 codes: the second byte of a row holds 3, its top 2 are padding
    kept.codes[1, 0] = 243
    with pytest.raises(TensorProblem, match="above 242"):
        kept.check_state()
    kept = ternary_stored(torch.randn(3, 8), None)
    kept.codes[2, 1] = 27  # a code in the fourth place of a byte that holds three
    with pytest.raises(TensorProblem, match="padding"):
        kept.check_state()
    kept = ternary_stored(torch.randn(3, 8), None)
    kept.scale[0, 0] = 0
    with pytest.raises(TensorProblem, match="scale"):
        kept.check_state()


def test_a_saved_matrix_loads_into_an_empty_one_of_its_shape():
    kept = ternary_stored(torch.randn(5, 40), 8)
    empty = TernaryTensor((5, 40), 8)
    empty.load_state_dict(kept.state_dict())
    assert torch.equal(empty.dequantize(), kept.dequantize())
    assert torch.equal(pack_trits(torch.full((1, 5), 2, dtype=torch.uint8)), torch.tensor([[242]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="group_size=3"):
        TernaryTensor((5, 40), 3)
