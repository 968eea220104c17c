"""The fused CPU kernels (low-bit codes, codebook rows) give the torch path's values, and step aside wherever they
do not apply."""

import ctypes
import platform
import shutil
from pathlib import Path

import pytest
import torch

from hf_tensorcompress.runtime import lowbit_kernel
from hf_tensorcompress.runtime.codebook import CodebookTensor
from hf_tensorcompress.runtime.lowbit import LowBitTensor

RUNS_HERE = (
    shutil.which("cc") is not None
    and platform.machine() == "x86_64"
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
)


def torch_path(stored: LowBitTensor | CodebookTensor, hidden: torch.Tensor, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as patch:
        patch.setenv("HF_TENSORCOMPRESS_KERNELS", "0")
        return stored.matmul_t(hidden)


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
def test_the_kernel_builds_on_this_machine():
    assert lowbit_kernel.load_kernel() is not None


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [16, 64, None])
@pytest.mark.parametrize("vectors", [1, 3, 8])
def test_fused_product_equals_the_torch_path(bits, group_size, vectors, monkeypatch):
    torch.manual_seed(bits * 100 + vectors)
    stored = LowBitTensor.quantize(torch.randn(1001, 192) * 0.1 + 0.02, bits, group_size)  # odd rows: the
    hidden = torch.randn(vectors, 192)  # last int3 row must not read past the buffer's end
    fused = lowbit_kernel.fused_matmul_t(stored.codes, stored.scale, stored.minimum, bits, stored.group_size, hidden)
    assert fused is not None
    reference = torch_path(stored, hidden, monkeypatch)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(stored.matmul_t(hidden), reference, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not RUNS_HERE or not Path("/proc/self/maps").exists(), reason="needs the kernel and Linux")
def test_the_rows_are_split_on_torchs_own_openmp_threads():
    library = lowbit_kernel.load_kernel()
    assert library.built_with_openmp() == 1
    maps = Path("/proc/self/maps").read_text().splitlines()
    torchs = {line.split()[-1] for line in maps if "libgomp" in line and "/torch/" in line}
    if not torchs:
        pytest.skip("this torch build does not load its own libgomp")
    # the OpenMP entry point the kernel's library resolves (itself and its dependencies) is torch's, not a second
    # runtime's (other packages, e.g. scikit-learn, may load their own under another name)
    ours = ctypes.cast(library.omp_get_max_threads, ctypes.c_void_p).value
    assert ours == ctypes.cast(ctypes.CDLL(torchs.pop()).omp_get_max_threads, ctypes.c_void_p).value


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
def test_leading_dims_dtypes_and_threads(monkeypatch):
    torch.manual_seed(0)
    stored = LowBitTensor.quantize(torch.randn(3 * lowbit_kernel.MIN_ROWS_PER_THREAD + 5, 64), 4, 32)
    hidden = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # rows split over three workers
        fused = stored.matmul_t(hidden)
    finally:
        torch.set_num_threads(threads)
    assert fused.shape == (2, 1, stored.shape[0]) and fused.dtype == torch.bfloat16
    exact = (hidden.float() @ stored.dequantize().T).bfloat16()  # the kernel accumulates in fp32
    torch.testing.assert_close(fused, exact, rtol=1e-2, atol=1e-2)
    assert torch.allclose(torch_path(stored, hidden.float(), monkeypatch).bfloat16(), exact, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
@pytest.mark.parametrize("entries", [256, 1024, 2048, 4096])
@pytest.mark.parametrize(("columns", "dim"), [(192, 4), (192, 8), (60, 3)])  # 20 indices a row: a partial block of 8
@pytest.mark.parametrize("vectors", [1, 4, 5, 8, 40])  # up to 4: the lookup table; from 5 on: decoded rows + GEMM
def test_fused_codebook_product_equals_the_torch_path(entries, columns, dim, vectors, monkeypatch):
    torch.manual_seed(entries + vectors)
    stored = CodebookTensor((2 * lowbit_kernel.MIN_ROWS_PER_THREAD + 3, columns), dim, entries)
    stored.set_indices(
        torch.randint(entries, (stored.shape[0], columns // dim)),
        torch.rand(stored.shape[0]) + 0.5,
        torch.randn(entries, dim),
    )
    hidden = torch.randn(vectors, columns)
    high = stored.high if stored.high_bits else None
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # rows split over two workers
        fused = lowbit_kernel.fused_codebook_matmul_t(
            stored.codes, high, stored.high_bits, stored.scale, stored.codebook, hidden
        )
    finally:
        torch.set_num_threads(threads)
    assert fused is not None
    reference = torch_path(stored, hidden, monkeypatch)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(stored.matmul_t(hidden), reference, rtol=1e-5, atol=1e-4)
    exact = hidden.double() @ stored.dequantize().double().T
    torch.testing.assert_close(fused.double(), exact, rtol=1e-5, atol=1e-4)


def test_the_codebook_kernel_steps_aside_where_it_does_not_apply(monkeypatch):
    stored = CodebookTensor((40, 64), 4, 65536)  # 8 high bits: the chunked torch path
    stored.reset_parameters()

    def fused(hidden, table=stored):
        return lowbit_kernel.fused_codebook_matmul_t(
            table.codes, table.high, table.high_bits, table.scale, table.codebook, hidden
        )

    assert fused(torch.randn(1, 64)) is None
    hidden = torch.randn(1, 64)
    torch.testing.assert_close(stored.matmul_t(hidden), hidden @ stored.dequantize().T, rtol=1e-5, atol=1e-4)
    small = CodebookTensor((40, 64), 4, 1024)
    small.reset_parameters()
    monkeypatch.setenv("HF_TENSORCOMPRESS_KERNELS", "0")
    assert fused(torch.randn(1, 64), small) is None


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
def test_a_codebook_product_of_five_or_more_vectors_decodes_rows_for_a_gemm(monkeypatch):
    """The lookup table's gathers grow with every hidden vector: from DECODE_FROM_VECTORS on, and for any number of
    vectors (a prompt, a perplexity pass), the rows are decoded in C for a GEMM instead."""
    stored = CodebookTensor((3000, 64), 4, 1024)
    stored.reset_parameters()
    decoded = []
    real = lowbit_kernel._decoded_codebook_product
    monkeypatch.setattr(lowbit_kernel, "_decoded_codebook_product", lambda *a: decoded.append(a[-1].shape) or real(*a))
    for vectors in (1, lowbit_kernel.DECODE_FROM_VECTORS - 1, lowbit_kernel.DECODE_FROM_VECTORS, 300):
        hidden = torch.randn(vectors, 64)
        torch.testing.assert_close(stored.matmul_t(hidden), hidden @ stored.dequantize().T, rtol=1e-5, atol=1e-4)
    assert decoded == [(lowbit_kernel.DECODE_FROM_VECTORS, 64), (300, 64)]


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
@pytest.mark.parametrize("vectors", [1, 6])
def test_a_product_that_must_pass_a_gradient_back_takes_the_torch_path(vectors, monkeypatch):
    """Training through a compressed head (LoRA on the layers below it, say) needs the gradient to the hidden
    states; the C code has none, so with grad enabled and a hidden that requires it the kernels step aside."""
    torch.manual_seed(vectors)
    codebook = CodebookTensor((300, 64), 4, 1024)
    codebook.reset_parameters()
    for stored in (codebook, LowBitTensor.quantize(torch.randn(300, 64), 4, 32)):
        hidden = torch.randn(vectors, 64, requires_grad=True)
        stored.matmul_t(hidden).square().sum().backward()
        reference = hidden.detach().clone().requires_grad_(True)
        (reference @ stored.dequantize().T).square().sum().backward()
        torch.testing.assert_close(hidden.grad, reference.grad, rtol=1e-4, atol=1e-3)
        with torch.no_grad():  # inference: the kernels again
            assert not stored.matmul_t(hidden).requires_grad


def test_it_steps_aside_where_it_does_not_apply(monkeypatch):
    stored = LowBitTensor.quantize(torch.randn(40, 64), 4, 64)

    def fused(hidden, codes=stored.codes, group=64):
        return lowbit_kernel.fused_matmul_t(codes, stored.scale, stored.minimum, 4, group, hidden)

    assert fused(torch.randn(lowbit_kernel.MAX_VECTORS + 1, 64)) is None  # a prompt: the chunked GEMM
    small_groups = LowBitTensor.quantize(torch.randn(40, 64), 4, 4)  # groups not a multiple of 8 codes
    assert (
        lowbit_kernel.fused_matmul_t(
            small_groups.codes, small_groups.scale, small_groups.minimum, 4, 4, torch.randn(1, 64)
        )
        is None
    )
    assert fused(torch.randn(0, 64)) is None
    monkeypatch.setenv("HF_TENSORCOMPRESS_KERNELS", "0")
    assert fused(torch.randn(1, 64)) is None
    odd = LowBitTensor.quantize(torch.randn(5, 12), 3, 4)  # 12 columns: the torch path alone
    torch.testing.assert_close(odd.matmul_t(torch.ones(1, 12)), torch.ones(1, 12) @ odd.dequantize().T)


def test_a_missing_compiler_falls_back_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TENSORCOMPRESS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(lowbit_kernel.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(lowbit_kernel.platform, "machine", lambda: "x86_64")
    lowbit_kernel.load_kernel.cache_clear()
    try:
        with pytest.warns(UserWarning, match="no C compiler found"):
            assert lowbit_kernel.load_kernel() is None
        stored = LowBitTensor.quantize(torch.randn(16, 64), 4, 64)
        hidden = torch.randn(1, 64)
        torch.testing.assert_close(stored.matmul_t(hidden), hidden @ stored.dequantize().T)
    finally:
        lowbit_kernel.load_kernel.cache_clear()


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_a_hidden_width_other_than_the_stored_columns_is_refused(kernels, monkeypatch):
    """The kernel took the width from its input: a wider vector read past every row (a crash or NaN)."""
    monkeypatch.setenv("HF_TENSORCOMPRESS_KERNELS", kernels)
    stored = LowBitTensor.quantize(torch.randn(40, 64), 4, 16)
    table = CodebookTensor((40, 64), 4, 1024)
    table.reset_parameters()
    for matrix in (stored, table):
        for width in (72, 56, 4096):
            with pytest.raises(ValueError, match=f"hidden states have {width} columns, but the stored matrix has 64"):
                matrix.matmul_t(torch.randn(1, width))


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("scale", lambda t: t.to(torch.uint8)),
        ("minimum", lambda t: t.to(torch.int8)),
        ("codes", lambda t: t.to(torch.int16)),
        ("codes", lambda t: t[:, :-4]),
        ("scale", lambda t: t[:-1]),
    ],
)
def test_the_lowbit_kernel_checks_its_buffers_before_the_call(name, bad):
    stored = LowBitTensor.quantize(torch.randn(40, 64), 4, 16)
    buffers = {"codes": stored.codes, "scale": stored.scale, "minimum": stored.minimum}
    buffers[name] = bad(buffers[name])
    with pytest.raises(ValueError, match=f"fused kernel: {name} is"):
        lowbit_kernel.fused_matmul_t(*buffers.values(), 4, 16, torch.randn(1, 64), columns=64)


@pytest.mark.parametrize("name", ["low", "high", "scale", "codebook"])
def test_the_codebook_kernel_checks_its_buffers_before_the_call(name):
    table = CodebookTensor((40, 64), 4, 1024)
    table.reset_parameters()
    buffers = {"low": table.codes, "high": table.high, "scale": table.scale, "codebook": table.codebook}
    buffers[name] = buffers[name][:-1] if name == "codebook" else buffers[name].to(torch.int32)
    with pytest.raises(ValueError, match=f"fused kernel: {name} is"):
        lowbit_kernel.fused_codebook_matmul_t(
            buffers["low"], buffers["high"], 2, buffers["scale"], buffers["codebook"], torch.randn(1, 64)
        )


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
def test_rows_decoded_in_c_by_index_equal_the_torch_decode():
    """What a product with many hidden states decodes: rows ``index`` into rows ``places`` of a block, for every
    code width and a codebook with high index bits; out-of-range indices are left to the torch path."""
    generator = torch.Generator().manual_seed(0)
    index, places = torch.randperm(1001, generator=generator)[:300], torch.randperm(400, generator=generator)[:300]
    for bits in (2, 3, 4, 8):
        stored = LowBitTensor.quantize(torch.randn(1001, 192, generator=generator), bits, 64)
        block, reference = torch.zeros(400, 192), torch.zeros(400, 192)
        reference[places] = stored.rows(index)
        assert lowbit_kernel.decode_lowbit_rows(
            stored.codes, stored.scale, stored.minimum, bits, 64, 192, index, block, places
        )
        assert torch.equal(block, reference)
    stored = CodebookTensor((1001, 192), 4, 1024)
    stored.reset_parameters()
    block, reference = torch.zeros(400, 192), torch.zeros(400, 192)
    reference[places] = stored.rows(index)
    stored.decode_into(index, block, places)
    assert torch.equal(block, reference)
    outside = index.clone()
    outside[0] = 1001
    assert not lowbit_kernel.decode_codebook_rows(
        stored.codes, stored.high, stored.high_bits, stored.scale, stored.codebook, outside, block, places
    )


def tiers_of(width: int, generator: torch.Generator) -> list:
    """Stored matrices of every layout ``decode_tiers`` reads: each code width, codebooks of 4-, 8- and 2-vectors
    with 0, 2, 3 and 4 high index bits (rows whose index count is not a multiple of 8 included)."""
    tiers = [
        LowBitTensor.quantize(torch.randn(37 + bits, width, generator=generator), bits, 16) for bits in (2, 3, 4, 8)
    ]
    for dim, entries in ((4, 256), (4, 1024), (8, 2048), (2, 4096), (8, 256)):
        stored = CodebookTensor((41 + dim, width), dim, entries)
        stored.set_indices(
            torch.randint(entries, (41 + dim, width // dim), generator=generator),
            torch.rand(41 + dim, generator=generator) + 0.5,
            torch.randn(entries, dim, generator=generator),
        )
        tiers.append(stored)
    return tiers


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
@pytest.mark.parametrize("width", [48, 80])  # 80 / 8 = 10 indices of 8-vectors a row: a partial group of 8
def test_one_call_over_every_tier_gives_each_tokens_stored_row(width):
    """``decode_tiers`` finds each token's tier from ``slot`` and decodes its row there (a tier of zeros where a
    tier stores nothing): the rows the torch decode gives, for token ids and for a range of them, on two threads."""
    generator = torch.Generator().manual_seed(width)
    tiers = tiers_of(width, generator)
    forms = [stored.kernel_form(lowbit_kernel) for stored in tiers] + [lowbit_kernel.zero_form(5, width)]
    table = lowbit_kernel.tier_table(forms, width)
    stored_rows = torch.cat([stored.dequantize() for stored in tiers] + [torch.zeros(5, width)])
    vocab = len(stored_rows)
    slot = torch.randperm(vocab, generator=generator).int()
    tokens = torch.randint(vocab, (700,), generator=generator)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = torch.full((700, width), float("nan"))
        assert lowbit_kernel.decode_tiers(slot, table, tokens, out)
        torch.testing.assert_close(out, stored_rows[slot.long()][tokens], rtol=1e-6, atol=1e-6)
        out = torch.full((vocab, width), float("nan"))
        assert lowbit_kernel.decode_tiers(slot, table, range(3, vocab), out)
        torch.testing.assert_close(out[: vocab - 3], stored_rows[slot.long()][3:], rtol=1e-6, atol=1e-6)
        scaled = torch.full((700, width), float("nan"))
        factor = float(torch.tensor(width**0.5, dtype=torch.float32))  # a scaled embedding's √d, as fp32 holds it
        assert lowbit_kernel.decode_tiers(slot, table, tokens, scaled, factor)
        unscaled = torch.empty(700, width)
        assert lowbit_kernel.decode_tiers(slot, table, tokens, unscaled)
        assert torch.equal(scaled, unscaled * torch.tensor(factor))  # the product a second pass would take
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")
def test_one_call_over_every_tier_refuses_what_it_cannot_read():
    """A token outside the vocabulary (negative too) or a slot outside the tiers raises IndexError rather than read
    another row or memory; an ``out`` of another dtype or width, or a tier it does not cover, is left to the caller."""
    generator = torch.Generator().manual_seed(0)
    tiers = tiers_of(48, generator)[:2]
    table = lowbit_kernel.tier_table([stored.kernel_form(lowbit_kernel) for stored in tiers], 48)
    vocab = sum(stored.shape[0] for stored in tiers)
    slot = torch.arange(vocab, dtype=torch.int32)
    out = torch.empty(4, 48)
    for tokens in (torch.tensor([0, vocab]), torch.tensor([-1, 2]), range(vocab - 1, vocab + 1)):
        with pytest.raises(IndexError, match="outside the vocabulary"):
            lowbit_kernel.decode_tiers(slot, table, tokens, out)
    bad_slot = slot.clone()
    bad_slot[2] = vocab
    with pytest.raises(IndexError, match="slot must be a permutation"):
        lowbit_kernel.decode_tiers(bad_slot, table, torch.tensor([1, 2]), out)
    assert not lowbit_kernel.decode_tiers(slot, table, torch.tensor([1]), out.double())
    assert not lowbit_kernel.decode_tiers(slot, table, torch.tensor([1]), torch.empty(4, 40))
    assert not lowbit_kernel.decode_tiers(slot[:-1], table, torch.tensor([1]), out)  # the tiers hold another count
    sixteen = LowBitTensor((8, 48), 16)
    assert sixteen.kernel_form(lowbit_kernel) is None
    assert lowbit_kernel.tier_table([tiers[0].kernel_form(lowbit_kernel), None], 48) is None
