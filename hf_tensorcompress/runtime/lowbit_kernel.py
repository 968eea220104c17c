"""Fused CPU kernels for ``LowBitTensor.matmul_t`` and ``CodebookTensor.matmul_t`` at small batch (a decoding step).

Ships inside saved checkpoints (torch and the standard library only). At batch 1 the tied output head of a low-bit
embedding must read every code of the table each step; unpacking the codes into a float chunk and calling a GEMM
(the torch path) costs three times the dense fp32 product, because every elementwise pass over the codes is a trip
through memory. This kernel reads each group of eight codes from its ``bits`` bytes once, spreads them into eight
lanes with one AVX2 variable shift, and multiplies them into the hidden state while they sit in registers, so the
head reads 4–8× fewer bytes than the fp32 table and does no extra pass. Codebook rows take a lookup table
instead (``fused_codebook_matmul_t``), or, for five or more hidden vectors, a C decode of each chunk of rows for a
GEMM.

None of the maintained libraries does this for these layouts: torch's ``_weight_int4pack_mm_for_cpu`` is int4 only
(and slower than the fp32 product on AVX2 machines), torchao and bitsandbytes have no 3-bit CPU path. The kernel is
hand-written C, compiled once per machine with the system C compiler into
``$HF_TENSORCOMPRESS_CACHE/kernels`` (default ``~/.cache/hf_tensorcompress/kernels``) and called through ``ctypes``.
Where it cannot run (no compiler, no AVX2, a GPU tensor, layouts it does not cover, or
``HF_TENSORCOMPRESS_KERNELS=0``) ``fused_matmul_t`` returns None and the caller takes the torch path, which gives
the same values up to float summation order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

#: Largest number of hidden vectors the kernel multiplies in one pass (a decoding step at batch ≤ 8); more go
#: through the chunked GEMM, which decodes each chunk once for all of them.
MAX_VECTORS = 8

#: Rows below which splitting the work over threads costs more than it saves.
MIN_ROWS_PER_THREAD = 4096

#: Hidden vectors from which a codebook product decodes its rows for a GEMM instead of summing lookup-table entries
#: (the table's gathers grow with every hidden vector; a decoded chunk serves all of them), and the rows it decodes
#: at a time (an fp32 buffer that stays in the cache).
DECODE_FROM_VECTORS = 5
DECODE_CHUNK_ROWS = 1024

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight codes of `bits` bits from the bytes at p, as floats. */
static inline __attribute__((always_inline)) __m256 decode8(const uint8_t *p, const int bits, const int whole_words,
                                                            const __m256i shifts, const __m256i mask) {
    if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    uint32_t word = 0;
    if (bits == 3 && whole_words) { memcpy(&word, p, 4); word &= 0xFFFFFFu; }
    else memcpy(&word, p, bits);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts), mask));
}

/* out[b, r] = sum_g scale[r, g] * (codes[r, g, :] . hidden[b, g, :]) + minimum[r, g] * group_sums[b, g]
   for rows [row_begin, row_end); 8 codes fill `bits` bytes, code i at bits i*bits.. of the little-endian word.
   A group's products are summed in `chains` independent accumulators per hidden vector: with one, each FMA waits
   for the one before (4-5 cycles) and at batch 1 that wait, not the memory, sets the speed. */
static inline __attribute__((always_inline)) void rows_kernel(
    const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t row_begin, int64_t row_end,
    int64_t row_count, int64_t row_bytes, const int bits, int64_t columns, int64_t group, const float *hidden,
    const float *group_sums, const int n, float *out, int64_t out_stride) {
    const int64_t groups = columns / group, blocks = group / 8;
    const int chains = n >= 4 ? 1 : (n >= 2 ? 2 : 4);
    const __m256i shifts = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int64_t r = row_begin; r < row_end; r++) {
        const uint8_t *p = codes + r * row_bytes;
        const int whole_words = r + 1 < row_count; /* a 4-byte load of 3 code bytes stays inside the buffer */
        __m256 total[8];
        float offset[8];
        for (int b = 0; b < n; b++) { total[b] = _mm256_setzero_ps(); offset[b] = 0.f; }
        for (int64_t g = 0; g < groups; g++) {
            __m256 acc[8][4];
            for (int b = 0; b < n; b++)
                for (int c = 0; c < chains; c++) acc[b][c] = _mm256_setzero_ps();
            const float *h = hidden + g * group;
            int64_t k = 0;
            for (; k + chains <= blocks; k += chains)
                for (int c = 0; c < chains; c++, p += bits) {
                    const __m256 f = decode8(p, bits, whole_words, shifts, mask);
                    for (int b = 0; b < n; b++)
                        acc[b][c] = _mm256_fmadd_ps(f, _mm256_loadu_ps(h + b * columns + 8 * (k + c)), acc[b][c]);
                }
            for (; k < blocks; k++, p += bits) {
                const __m256 f = decode8(p, bits, whole_words, shifts, mask);
                for (int b = 0; b < n; b++)
                    acc[b][0] = _mm256_fmadd_ps(f, _mm256_loadu_ps(h + b * columns + 8 * k), acc[b][0]);
            }
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[r * groups + g]));
            const float m = _cvtsh_ss(minimum[r * groups + g]);
            for (int b = 0; b < n; b++) {
                __m256 sum = acc[b][0];
                for (int c = 1; c < chains; c++) sum = _mm256_add_ps(sum, acc[b][c]);
                total[b] = _mm256_fmadd_ps(sum, s, total[b]);
                offset[b] += m * group_sums[b * groups + g];
            }
        }
        for (int b = 0; b < n; b++) out[b * out_stride + r] = hsum(total[b]) + offset[b];
    }
}

#define ROWS(B, N) rows_kernel(codes, scale, minimum, row_begin, row_end, row_count, row_bytes, B, columns, group, \
                               hidden, group_sums, N, out, out_stride)
#define BY_N(B) switch (n) { case 1: ROWS(B, 1); break; case 2: ROWS(B, 2); break; case 3: ROWS(B, 3); break; \
    case 4: ROWS(B, 4); break; case 5: ROWS(B, 5); break; case 6: ROWS(B, 6); break; case 7: ROWS(B, 7); break; \
    default: ROWS(B, 8); }

static void lowbit_rows(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t row_begin,
                        int64_t row_end, int64_t row_count, int64_t row_bytes, int bits, int64_t columns,
                        int64_t group, const float *hidden, const float *group_sums, int n, float *out,
                        int64_t out_stride) {
    switch (bits) {
        case 2: BY_N(2); break;
        case 3: BY_N(3); break;
        case 4: BY_N(4); break;
        default: BY_N(8);
    }
}

/* Rows [0, rows) in `threads` equal parts, one per thread of the process's OpenMP runtime. Built with -fopenmp the
   library needs libgomp.so.1, which in a torch process is torch's own, already loaded: its worker threads, still
   spinning after torch's last parallel op, take the parts at once, where threads of another pool would wait for
   the cores they hold. Built without OpenMP, the parts run one after another. */
#define OVER_ROWS(ROWS_CALL) \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") \
    for (int part = 0; part < threads; part++) { \
        const int64_t begin = rows * part / threads, end = rows * (part + 1) / threads; \
        ROWS_CALL; \
    }

int built_with_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

void lowbit_matmul_t(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t rows,
                     int64_t row_bytes, int bits, int64_t columns, int64_t group, const float *hidden,
                     const float *group_sums, int n, float *out, int threads) {
    OVER_ROWS(lowbit_rows(codes, scale, minimum, begin, end, rows, row_bytes, bits, columns, group, hidden,
                          group_sums, n, out, rows))
}

/* Codebook rows (runtime/codebook.py): out[b, r] = scale[r] * sum_k table[b, k, index(r, k)], where table[b, k, e] is
   hidden[b]'s k-th dim-slice dotted with codebook entry e, and index(r, k) = low[r, k] | high(r, k) << 8 with the
   high parts of eight indices packed in `high_bits` bytes like the codes above. Eight indices at a time are built
   in one AVX2 register (low bytes widened, high bits spread by one variable shift) and their table entries
   fetched with one gather. The gathers hit random entries, so the slices k of the table a pass reads must stay in
   the core's L2 cache: the rows are swept once per block of `block` slices (TABLE_BLOCK_BYTES of table), summing
   into out, and scaled after the last block. */
#define TABLE_BLOCK_BYTES (256 * 1024)

/* The packed high parts of the eight indices from k0 on (0 when there are none), and the index of slot k among them:
   its low byte and its high bits from that word. */
static inline uint32_t high_word(const uint8_t *hi, int64_t k0, int high_bits) {
    uint32_t word = 0;
    if (high_bits) memcpy(&word, hi + (k0 / 8) * high_bits, high_bits);
    return word;
}

static inline int64_t codebook_index(const uint8_t *lo, uint32_t word, int64_t k, int64_t k0, int high_bits,
                                     uint32_t mask) {
    return lo[k] | (int64_t)((word >> ((k - k0) * high_bits)) & mask) << 8;
}

static inline __attribute__((always_inline)) void codebook_kernel(
    const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t row_begin, int64_t row_end,
    int64_t vectors, int64_t high_bytes, const int high_bits, const float *table, int64_t entries, const int n,
    float *out, int64_t out_stride) {
    const int64_t plane = vectors * entries;
    const int64_t fitting = TABLE_BLOCK_BYTES / (4 * entries * n) / 8 * 8, block = fitting > 8 ? fitting : 8;
    const uint32_t mask = high_bits ? (1u << high_bits) - 1 : 0;
    const __m256i shifts = _mm256_setr_epi32(0, high_bits, 2 * high_bits, 3 * high_bits, 4 * high_bits,
                                             5 * high_bits, 6 * high_bits, 7 * high_bits);
    const __m256i high_mask = _mm256_set1_epi32((int)mask);
    const __m256i lanes = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32((int)entries));
    for (int64_t k_begin = 0; k_begin < vectors; k_begin += block) {
        const int64_t k_end = k_begin + block < vectors ? k_begin + block : vectors;
        const int64_t whole = k_begin + (k_end - k_begin) / 8 * 8; /* block is a multiple of 8: only the last
                                                                       block can end in a partial group */
        for (int64_t r = row_begin; r < row_end; r++) {
            const uint8_t *lo = low + r * vectors, *hi = high + r * high_bytes;
            __m256 acc[8];
            float tail[8];
            for (int b = 0; b < n; b++) { acc[b] = _mm256_setzero_ps(); tail[b] = 0.f; }
            for (int64_t k0 = k_begin; k0 < whole; k0 += 8) {
                __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lo + k0)));
                if (high_bits) {
                    const uint32_t word = high_word(hi, k0, high_bits);
                    __m256i part = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts),
                                                    high_mask);
                    at = _mm256_or_si256(at, _mm256_slli_epi32(part, 8));
                }
                at = _mm256_add_epi32(at, lanes);
                const float *t = table + k0 * entries;
                for (int b = 0; b < n; b++)
                    acc[b] = _mm256_add_ps(acc[b], _mm256_i32gather_ps(t + b * plane, at, 4));
            }
            if (whole < k_end) { /* the last partial group of indices */
                const uint32_t word = high_word(hi, whole, high_bits);
                for (int64_t k = whole; k < k_end; k++) {
                    const int64_t at = k * entries + codebook_index(lo, word, k, whole, high_bits, mask);
                    for (int b = 0; b < n; b++) tail[b] += table[b * plane + at];
                }
            }
            const float s = k_end == vectors ? _cvtsh_ss(scale[r]) : 1.f;
            for (int b = 0; b < n; b++) {
                const float part = hsum(acc[b]) + tail[b];
                float *o = out + b * out_stride + r;
                *o = (k_begin ? *o + part : part) * s;
            }
        }
    }
}

/* table[b, k, e] = hidden[b, k*dim : (k+1)*dim] . codebook[e] (codebook fp16, (entries, dim)), eight entries at a
   time from the codebook transposed to fp32 in `scratch` (dim * entries floats), in the calling thread before the
   rows are split. */
void codebook_table(const float *hidden, const uint16_t *codebook, int64_t vectors, int64_t dim, int64_t entries,
                    int n, float *scratch, float *table) {
    for (int64_t e = 0; e < entries; e++)
        for (int64_t d = 0; d < dim; d++) scratch[d * entries + e] = _cvtsh_ss(codebook[e * dim + d]);
    for (int b = 0; b < n; b++)
        for (int64_t k = 0; k < vectors; k++) {
            const float *h = hidden + (b * vectors + k) * dim;
            float *t = table + (b * vectors + k) * entries;
            for (int64_t e = 0; e < entries; e += 8) {
                __m256 sum = _mm256_setzero_ps();
                for (int64_t d = 0; d < dim; d++)
                    sum = _mm256_fmadd_ps(_mm256_set1_ps(h[d]), _mm256_loadu_ps(scratch + d * entries + e), sum);
                _mm256_storeu_ps(t + e, sum);
            }
        }
}

#define CODEBOOK(H, N) codebook_kernel(low, high, scale, row_begin, row_end, vectors, high_bytes, H, table, entries, \
                                       N, out, out_stride)
#define CODEBOOK_BY_N(H) switch (n) { case 1: CODEBOOK(H, 1); break; case 2: CODEBOOK(H, 2); break; \
    case 3: CODEBOOK(H, 3); break; case 4: CODEBOOK(H, 4); break; default: CODEBOOK(H, n); }

static void codebook_rows(const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t row_begin,
                          int64_t row_end, int64_t vectors, int64_t high_bytes, int high_bits, const float *table,
                          int64_t entries, int n, float *out, int64_t out_stride) {
    switch (high_bits) {
        case 0: CODEBOOK_BY_N(0); break;
        case 2: CODEBOOK_BY_N(2); break;
        case 3: CODEBOOK_BY_N(3); break;
        default: CODEBOOK_BY_N(4);
    }
}

/* Rows first .. first + rows of a codebook matrix decoded to fp32, out[r - first, k*dim : (k+1)*dim] = scale[r] *
   codebook[index(r, k)] (codebook as fp32, (entries, dim)): for products with more hidden states than the lookup
   table pays for, since its gathers grow with every hidden state while one decoded chunk serves them all in a GEMM. */
static inline __attribute__((always_inline)) void codebook_decode_kernel(
    const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t row_begin, int64_t row_end,
    int64_t vectors, int64_t high_bytes, int high_bits, const float *codebook, const int64_t dim, int64_t first,
    float *out) {
    const uint32_t mask = high_bits ? (1u << high_bits) - 1 : 0;
    for (int64_t r = row_begin; r < row_end; r++) {
        const uint8_t *lo = low + r * vectors, *hi = high + r * high_bytes;
        const float s = _cvtsh_ss(scale[r]);
        float *o = out + (r - first) * vectors * dim;
        for (int64_t k0 = 0; k0 < vectors; k0 += 8) {
            const uint32_t word = high_word(hi, k0, high_bits);
            const int64_t k_end = k0 + 8 < vectors ? k0 + 8 : vectors;
            for (int64_t k = k0; k < k_end; k++) {
                const float *entry = codebook + codebook_index(lo, word, k, k0, high_bits, mask) * dim;
                for (int64_t d = 0; d < dim; d++) o[k * dim + d] = s * entry[d];
            }
        }
    }
}

static void codebook_decode_rows(const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t row_begin,
                                 int64_t row_end, int64_t vectors, int64_t high_bytes, int high_bits,
                                 const float *codebook, int64_t dim, int64_t first, float *out) {
#define DECODE(DIM) codebook_decode_kernel(low, high, scale, row_begin, row_end, vectors, high_bytes, high_bits, \
                                           codebook, DIM, first, out)
    switch (dim) { case 4: DECODE(4); break; case 8: DECODE(8); break; default: DECODE(dim); }
#undef DECODE
}

void codebook_decode(const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t first, int64_t rows,
                     int64_t vectors, int64_t high_bytes, int high_bits, const float *codebook, int64_t dim,
                     float *out, int threads) {
    OVER_ROWS(codebook_decode_rows(low, high, scale, first + begin, first + end, vectors, high_bytes, high_bits,
                                   codebook, dim, first, out))
}

void codebook_matmul_t(const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t rows, int64_t vectors,
                       int64_t high_bytes, int high_bits, const float *table, int64_t entries, int n, float *out,
                       int threads) {
    OVER_ROWS(codebook_rows(low, high, scale, begin, end, vectors, high_bytes, high_bits, table, entries, n, out,
                            rows))
}
"""


#: Compiler flags; part of the cached file's name, so changing them builds a new file. Where the compiler has no
#: OpenMP, the library is built without ``-fopenmp`` and runs on one thread.
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-fopenmp")

#: The functions a loaded library must export (a foreign file under the kernel's name has other ones).
SYMBOLS = ("lowbit_matmul_t", "codebook_matmul_t", "codebook_table", "codebook_decode", "built_with_openmp")


def kernel_dir() -> Path:
    cache = os.environ.get("HF_TENSORCOMPRESS_CACHE", Path.home() / ".cache" / "hf_tensorcompress")
    return Path(cache) / "kernels"


def compiler_timeout() -> float:
    """Seconds a compiler call may take (``HF_TENSORCOMPRESS_CC_TIMEOUT``, default 120): a hanging ``CC`` must not
    hang the model's first forward."""
    return float(os.environ.get("HF_TENSORCOMPRESS_CC_TIMEOUT", "120"))


def _run(command: list[str]) -> str:
    """``command``'s stdout; RuntimeError when it fails or outlives ``compiler_timeout()`` (its whole process group
    is killed then, so a wrapper script's children do not linger)."""
    timeout = compiler_timeout()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            if hasattr(os, "killpg"):
                os.killpg(process.pid, signal.SIGKILL)
            else:  # Windows: no process groups
                process.kill()
            process.communicate()
            raise RuntimeError(f"{command[0]} ran longer than {timeout:g} s (HF_TENSORCOMPRESS_CC_TIMEOUT)") from None
    if process.returncode:
        raise RuntimeError(f"{command[0]} failed: {err.strip()[-500:]}")
    return out


def _compiler() -> tuple[str, str]:
    """The C compiler to call and what identifies its output: resolved path and ``--version`` text."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    return compiler, os.path.realpath(compiler) + "\n" + _run([compiler, "--version"])


def kernel_path(identity: str, flags: tuple[str, ...] | None = None) -> Path:
    """The cached file for this source, compiler ``identity`` and ``flags`` (default ``FLAGS``): any change gets a
    new name."""
    key = hashlib.sha256("\0".join([SOURCE, identity, *(FLAGS if flags is None else flags)]).encode()).hexdigest()[:16]
    return kernel_dir() / f"lowbit-{key}.so"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checksum(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def verified(target: Path) -> bool:
    """Whether ``target`` is the file a build wrote (its checksum, written after the build, matches): a truncated
    or replaced file is rebuilt instead of mapped, which would crash the process (SIGBUS) or call foreign code."""
    try:
        return _checksum(target).read_text().strip() == _digest(target)
    except OSError:
        return False


def _compile(target: Path, compiler: str, flags: tuple[str, ...]) -> None:
    """Build the shared library into ``target`` and its checksum beside it (temporary names renamed into place:
    processes that compile at the same time each finish with whole files)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        source, built = Path(scratch) / "lowbit.c", Path(scratch) / target.name
        source.write_text(SOURCE)
        _run([compiler, *flags, str(source), "-o", str(built)])
        checksum = Path(scratch) / "checksum"
        checksum.write_text(_digest(built) + "\n")
        os.replace(built, target)
        os.replace(checksum, _checksum(target))


def _load() -> ctypes.CDLL:
    """The verified library, built first where the cached file is missing or does not verify."""
    compiler, identity = _compiler()
    serial = tuple(flag for flag in FLAGS if flag != "-fopenmp")  # a compiler without OpenMP: one thread
    target = kernel_path(identity)
    if not verified(target) and not verified(kernel_path(identity, serial)):
        try:
            _compile(target, compiler, FLAGS)
        except RuntimeError:
            target = kernel_path(identity, serial)
            _compile(target, compiler, serial)
    elif not verified(target):
        target = kernel_path(identity, serial)
    library = ctypes.CDLL(str(target))
    missing = [name for name in SYMBOLS if not hasattr(library, name)]
    if missing:  # a foreign file with a forged checksum: removed, so the next process builds the kernel
        target.unlink(missing_ok=True)
        raise RuntimeError(f"{target} lacks {missing}; removed, the next process rebuilds it")
    return library


@functools.cache
def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (with one warning saying why) where it cannot run here."""
    if platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in (
        "AVX2",
        "AVX512",
    ):
        return None  # the torch path serves other CPUs; nothing to warn about
    try:
        library = _load()
    except (OSError, RuntimeError, ValueError) as error:  # ValueError: a bad timeout setting
        warnings.warn(
            f"low-bit products take the slower torch path: the CPU kernel is unavailable ({error})", stacklevel=3
        )
        return None
    library.lowbit_matmul_t.restype = library.codebook_matmul_t.restype = library.codebook_table.restype = None
    library.lowbit_matmul_t.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.codebook_matmul_t.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.codebook_table.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    library.codebook_decode.restype = None
    library.codebook_decode.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.built_with_openmp.restype = ctypes.c_int
    return library


def _enabled(stored: torch.Tensor, vectors: int, most: int | None = MAX_VECTORS) -> bool:
    """What the kernels need: not switched off, a CPU tensor with rows, and vectors to multiply (a decoding step's
    few, ``most``, for the products that read the codes once per vector)."""
    return (
        os.environ.get("HF_TENSORCOMPRESS_KERNELS", "1") != "0"
        and stored.device.type == "cpu"
        and stored.shape[0] > 0
        and vectors > 0
        and (most is None or vectors <= most)
    )


def covered(codes: torch.Tensor, bits: int, columns: int, group: int, vectors: int) -> bool:
    """Whether the kernel handles this product (else the torch path does)."""
    return _enabled(codes, vectors) and bits in (2, 3, 4, 8) and columns % 8 == 0 and group % 8 == 0


def _carries_gradient(hidden: torch.Tensor) -> bool:
    """Whether the product must pass a gradient back to ``hidden`` (training through the head): the C code is not
    differentiable, so the torch path serves it."""
    return torch.is_grad_enabled() and hidden.requires_grad


def _expect(tensor: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """A buffer the C code reads by the sizes it is given: anything else would be read past its end."""
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"fused kernel: {name} is {tensor.dtype} of shape {list(tensor.shape)}, expected {dtype} of shape "
            f"{list(shape)}"
        )


def _expect_width(hidden: torch.Tensor, columns: int) -> None:
    if hidden.shape[-1] != columns:
        raise ValueError(
            f"fused kernel: the hidden states have {hidden.shape[-1]} columns, but the stored matrix has {columns}"
        )


def fused_matmul_t(
    codes: torch.Tensor,
    scale: torch.Tensor,
    minimum: torch.Tensor,
    bits: int,
    group: int,
    hidden: torch.Tensor,
    columns: int | None = None,
) -> torch.Tensor | None:
    """``hidden @ Wᵀ`` for the packed ``W`` (``(..., columns) → (..., rows)`` in ``hidden``'s dtype), or None where
    the kernel does not cover it. The sizes come from the stored tensors (``columns``: the matrix's width, by default
    what the codes hold) and are checked before the C code runs: a ``hidden`` of another width, or buffers of
    another dtype or shape, raise ValueError."""
    if bits not in (2, 3, 4, 8):
        return None
    rows = codes.shape[0]
    columns = codes.shape[1] // bits * 8 if columns is None else columns
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or columns % group:
        raise ValueError(f"fused kernel: group={group!r} must be a positive int dividing the {columns} columns")
    _expect(codes, "codes", torch.uint8, (rows, -(-columns // 8) * bits))
    _expect(scale, "scale", torch.float16, (rows, columns // group))
    _expect(minimum, "minimum", torch.float16, (rows, columns // group))
    _expect_width(hidden, columns)
    flat = hidden.reshape(-1, columns)
    if not covered(codes, bits, columns, group, len(flat)) or _carries_gradient(hidden):
        return None
    library = load_kernel()
    if library is None:
        return None
    codes, scale, minimum = codes.contiguous(), scale.contiguous(), minimum.contiguous()
    flat = flat.float().contiguous()
    group_sums = flat.view(len(flat), -1, group).sum(-1).contiguous()
    out = torch.empty(len(flat), rows)

    library.lowbit_matmul_t(codes.data_ptr(), scale.data_ptr(), minimum.data_ptr(), rows, codes.shape[1], bits,
        columns, group, flat.data_ptr(), group_sums.data_ptr(), len(flat), out.data_ptr(), _workers(rows))  # fmt: skip
    return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)


def fused_codebook_matmul_t(
    low: torch.Tensor,
    high: torch.Tensor | None,
    high_bits: int,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    hidden: torch.Tensor,
) -> torch.Tensor | None:
    """``hidden @ Wᵀ`` for a ``CodebookTensor``'s ``W`` (index low bytes ``low``, packed ``high`` bits, per-row fp16
    ``scale``, fp16 ``codebook``), or None where the kernel does not cover it. Each hidden vector's dot products with
    every codebook entry, slice by slice, form a table (a few hundred KB); each logit is then a sum of table entries
    picked by the row's indices, so the rows are never decoded. From ``DECODE_FROM_VECTORS`` hidden vectors on (any
    number of them), the rows are decoded in C a chunk at a time for a GEMM instead. The sizes come from the stored
    tensors and are checked before the C code runs (an index is a byte plus ``high_bits`` bits, so the codebook must
    hold ``256 · 2^high_bits`` entries): a ``hidden`` of another width, or buffers of another dtype or shape, raise
    ValueError."""
    if high_bits not in (0, 2, 3, 4):
        return None
    rows, vectors = low.shape[0], low.shape[-1]
    dim = codebook.shape[-1]
    _expect(low, "low", torch.uint8, (rows, vectors))
    _expect(scale, "scale", torch.float16, (rows, 1))
    _expect(codebook, "codebook", torch.float16, (256 << high_bits, dim))
    if high_bits:
        _expect(high, "high", torch.uint8, (rows, -(-vectors // 8) * high_bits))
    entries = codebook.shape[0]
    _expect_width(hidden, vectors * dim)
    flat = hidden.reshape(-1, vectors * dim)
    decode = len(flat) >= DECODE_FROM_VECTORS
    if not _enabled(low, len(flat), None if decode else MAX_VECTORS) or _carries_gradient(hidden):
        return None
    library = load_kernel()
    if library is None:
        return None
    flat, codebook = flat.float().contiguous(), codebook.contiguous()
    low, scale = low.contiguous(), scale.contiguous()
    high = low if high is None else high.contiguous()  # not read when high_bits == 0
    if decode:
        out = _decoded_codebook_product(library, low, high, high_bits, scale, codebook.float().contiguous(), flat)
        return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)
    table, scratch = torch.empty(len(flat), vectors, entries), torch.empty(dim, entries)
    library.codebook_table(flat.data_ptr(), codebook.data_ptr(), vectors, dim, entries, len(flat),
        scratch.data_ptr(), table.data_ptr())  # fmt: skip
    out = torch.empty(len(flat), rows)

    library.codebook_matmul_t(low.data_ptr(), high.data_ptr(), scale.data_ptr(), rows, vectors, high.shape[1],
        high_bits, table.data_ptr(), entries, len(flat), out.data_ptr(), _workers(rows))  # fmt: skip
    return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)


def _decoded_codebook_product(
    library: ctypes.CDLL,
    low: torch.Tensor,
    high: torch.Tensor,
    high_bits: int,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    flat: torch.Tensor,
) -> torch.Tensor:
    """``flat @ Wᵀ`` (``(n, rows)``) decoding ``DECODE_CHUNK_ROWS`` rows at a time into one fp32 buffer (C) and
    multiplying each chunk with every hidden vector in one GEMM: a codebook row costs one copy of its entries
    here, where the lookup table costs one gather per entry and hidden vector."""
    rows, vectors = low.shape
    dim = codebook.shape[1]
    chunk = min(rows, DECODE_CHUNK_ROWS)
    decoded, out = torch.empty(chunk, vectors * dim), torch.empty(rows, len(flat))
    for first in range(0, rows, chunk):
        count = min(chunk, rows - first)
        threads = _workers(count, per_thread=DECODE_CHUNK_ROWS // 2)
        library.codebook_decode(low.data_ptr(), high.data_ptr(), scale.data_ptr(), first, count, vectors,
            high.shape[1], high_bits, codebook.data_ptr(), dim, decoded.data_ptr(), threads)  # fmt: skip
        torch.mm(decoded[:count], flat.T, out=out[first : first + count])
    return out.T


def _workers(rows: int, per_thread: int = MIN_ROWS_PER_THREAD) -> int:
    """Threads the C code splits ``rows`` over: ``torch.get_num_threads()``, fewer for small products."""
    return max(1, min(torch.get_num_threads(), rows // per_thread))
