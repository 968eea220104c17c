"""LowBitTensor: packed low-bit storage that compressed layers (and checkpoints) keep their tensors in."""

import sys

import pytest
import torch

from hf_tensorcompress.core.export import shipped_files, shipped_source
from hf_tensorcompress.core.registry import get_method
from hf_tensorcompress.runtime.lowbit import LowBitTensor, pack, stored_values, unpack


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_pack_round_trips_every_code(bits):
    codes = torch.randint(0, 2**bits, (5, 21), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 3 * bits)  # 21 codes pad to 24 = 3 × 8
    assert torch.equal(unpack(packed, bits, 21).long(), codes.long())


@pytest.mark.parametrize("bits,group", [(1, 8), (1, None), (2, 8), (3, 16), (4, 8), (4, None), (8, None), (16, None)])
def test_stored_values_are_what_the_stored_form_decodes(bits, group):
    """Quantization-aware training computes with ``stored_values``; it must equal the saved codes' decode bit for bit
    (constant groups included, where the scale is clamped)."""
    torch.manual_seed(0)
    matrix = torch.randn(12, 48) * torch.logspace(-3, 1, 12)[:, None]
    matrix[3] = 0.25
    expected = LowBitTensor.quantize(matrix, bits, group).dequantize()
    assert torch.equal(stored_values(matrix, bits, group, torch.float32), expected)
    assert torch.equal(
        stored_values(matrix.double(), bits, group, torch.float64),
        LowBitTensor.quantize(matrix.double(), bits, group).dequantize(torch.float64),
    )


@pytest.mark.parametrize("bits,group", [(2, 8), (3, 16), (4, 8), (4, None), (8, None)])
def test_quantize_error_is_within_half_a_step(bits, group):
    torch.manual_seed(0)
    matrix = torch.randn(40, 32)
    stored = LowBitTensor.quantize(matrix, bits, group)
    error = (stored.dequantize() - matrix).abs().reshape(40, -1, stored.group_size)
    step = stored.scale.float()[..., None]
    assert (error <= step * 0.5 + 2e-3 * matrix.abs().max()).all()
    if bits == 8:
        assert error.max() < 0.02


def test_one_bit_codes_are_signs_at_each_groups_mean_magnitude():
    """1 bit: a weight's sign times its group's mean |x| (the least-squares level of sign codes), eight codes a byte,
    the first column in the highest bit (as Biprop packs its masks, which the ONNX decode of 1-bit codes reads);
    rounding the stored values again gives them back (a kept checkpoint reloads what was validated)."""
    torch.manual_seed(0)
    matrix = torch.randn(6, 256)
    stored = LowBitTensor.quantize(matrix, 1, 128)
    level = matrix.reshape(6, 2, 128).abs().mean(-1).half().float()
    expected = torch.where(matrix.reshape(6, 2, 128) > 0, 1.0, -1.0) * level[..., None]
    assert torch.equal(stored.dequantize(), expected.reshape(6, 256))
    assert stored.storage_bits() == 6 * 256 + 2 * 6 * 2 * 16  # a bit a weight + fp16 scale and minimum a group
    assert stored.storage_bits() / matrix.numel() == 1.25
    again = LowBitTensor.quantize(stored.dequantize(), 1, 128)
    assert torch.equal(again.dequantize(), stored.dequantize()) and torch.equal(again.codes, stored.codes)
    first_column_high = pack(torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.uint8), 1)
    assert first_column_high.tolist() == [[128, 64]]


def test_int4_is_two_codes_per_byte_and_bits_are_counted():
    stored = LowBitTensor.quantize(torch.randn(10, 64), 4, 32)
    assert stored.codes.shape == (10, 32)
    assert stored.storage_bits() == 10 * 32 * 8 + 2 * 10 * 2 * 16  # codes + fp16 scale and minimum per group
    assert LowBitTensor.quantize(torch.randn(10, 64), 16).storage_bits() == 10 * 64 * 16


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8, 16])
def test_rows_and_chunked_matmul_match_the_full_table(bits):
    torch.manual_seed(1)
    stored = LowBitTensor.quantize(torch.randn(50, 24), bits, 8)
    table = stored.dequantize()
    ids = torch.tensor([7, 0, 49, 7])
    assert torch.equal(stored.rows(ids), table[ids])
    hidden = torch.randn(2, 3, 24)
    torch.testing.assert_close(stored.matmul_t(hidden, chunk=16), hidden @ table.T)


def test_a_product_decodes_few_large_chunks_on_a_gpu_and_cache_sized_ones_on_the_cpu(monkeypatch):
    """On a GPU each decoded chunk costs the same kernel launches whatever its size, so the default chunk there is as
    many rows as ``ACCELERATOR_CHUNK_BYTES`` hold (SmolLM2's bf16 table in two), on the CPU ``CPU_CHUNK_ROWS``; the
    product is the same whatever the chunk."""
    from hf_tensorcompress.runtime import lowbit

    stored = LowBitTensor((49152, 576), 4, 64)
    on_gpu = torch.empty(1, 576, dtype=torch.bfloat16, device="meta")  # any device that is not the CPU
    assert stored.chunk_rows(on_gpu) == lowbit.ACCELERATOR_CHUNK_BYTES // (576 * 2) == 29127
    assert stored.chunk_rows(torch.empty(1, 576)) == lowbit.CPU_CHUNK_ROWS
    torch.manual_seed(2)
    small = LowBitTensor.quantize(torch.randn(50, 24), 3, 8)
    hidden = torch.randn(3, 24)
    expected = hidden @ small.dequantize().T
    monkeypatch.setenv("HF_TENSORCOMPRESS_KERNELS", "0")  # the torch path, which the chunk size drives
    monkeypatch.setattr(lowbit, "CPU_CHUNK_ROWS", 7)
    decoded = []
    monkeypatch.setattr(small, "_decode", lambda rows, dtype, out: decoded.append(rows) or out.copy_(
        LowBitTensor._decode(small, rows, dtype)))  # fmt: skip
    torch.testing.assert_close(small.matmul_t(hidden), expected)
    assert [(rows.start, rows.stop) for rows in decoded] == [(start, start + 7) for start in range(0, 50, 7)]


def test_state_dict_loads_into_an_empty_layer_of_the_same_spec():
    stored = LowBitTensor.quantize(torch.randn(12, 16), 2, 8)
    empty = LowBitTensor.from_spec(stored.spec())
    assert not torch.equal(empty.dequantize(), stored.dequantize())
    empty.load_state_dict(stored.state_dict())
    assert torch.equal(empty.dequantize(), stored.dequantize())


def test_model_dtype_changes_keep_the_storage_format():
    stored = LowBitTensor.quantize(torch.randn(6, 16), 4, 8)
    before = stored.dequantize()
    stored.to(torch.float64).float()
    assert stored.scale.dtype == torch.float16 and stored.codes.dtype == torch.uint8
    assert torch.equal(stored.dequantize(), before)
    assert LowBitTensor.quantize(torch.randn(3, 8), 16).to(torch.float32).codes.dtype == torch.bfloat16


def test_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="choose one of"):
        LowBitTensor((4, 8), 5)
    with pytest.raises(ValueError, match="dividing the 10 columns"):
        LowBitTensor((4, 10), 4, 4)
    with pytest.raises(ValueError, match="reshape to 2-D"):
        LowBitTensor.quantize(torch.randn(2, 3, 4), 8)


def test_ships_inside_checkpoints_with_torch_only():
    methods = [get_method("tiered")]
    files = shipped_files(methods, ("lowbit_kernel",))

    def imports(name: str) -> list[str]:
        path = next(path for path in files if path.name == name)  # the tiered layer imports both
        source = shipped_source(path, files, methods)
        return [line for line in source.splitlines() if line.startswith(("import ", "from "))]

    def imported(line: str) -> str:  # the package an absolute import reads from (collections.abc: collections)
        module = line.split()[1]
        return module if module.startswith(".") else module.split(".")[0]

    standard = set(sys.stdlib_module_names)
    allowed = ("torch", "__future__", "optional", "contract", "bit_packing")  # shipped with every checkpoint
    assert all(any(name in line for name in allowed) or imported(line) in standard for line in imports("lowbit.py"))
    kernel = {"torch", ".lowbit_kernel_cache", ".lowbit_kernel_source"}  # the kernel's own files: stdlib only
    for name in ("lowbit_kernel.py", "lowbit_kernel_cache.py", "lowbit_kernel_source.py"):
        assert {imported(line) for line in imports(name)} - {"__future__"} <= standard | kernel, name
