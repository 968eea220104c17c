"""The C source of the fused CPU kernels (``lowbit_kernel.py`` calls them; ``lowbit_kernel_cache.py`` builds them).

One AVX2 routine per stored form: ``lowbit_matmul_t`` (packed 2/3/4/8-bit codes with fp16 group scales and minima),
``codebook_table`` + ``codebook_matmul_t`` (codebook rows summed from a lookup table of hidden-state dot products),
``codebook_decode`` and ``lowbit_decode`` (rows decoded to fp32, a chunk or a set of rows at a time, for a GEMM),
``tiered_decode`` (a tiered embedding's rows, across all its tiers in one call), each splitting its rows over the
process's OpenMP threads where it was built with ``-fopenmp``. Kept as text: the cache key hashes it, so any edit
builds a new file.

Ships inside saved checkpoints that store packed codes: standard library only (plain text).
"""

from __future__ import annotations

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
    /* The bytes put together in a register: a copy of high_bits bytes into a word is a call, or a store the next
       load of the whole word waits for, on every eighth index. */
    const uint8_t *p = hi + (k0 / 8) * high_bits;
    switch (high_bits) {
        case 2: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
        case 3: return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
        case 4: return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        default: return 0;
    }
}

static inline int64_t codebook_index(const uint8_t *lo, uint32_t word, int64_t k, int64_t k0, int high_bits,
                                     uint32_t mask) {
    return lo[k] | (int64_t)((word >> ((k - k0) * high_bits)) & mask) << 8;
}

/* Indices k0 .. k0 + 7 of a row in one register: their low bytes widened, their high bits spread by one variable
   shift (shifts: 0, high_bits, 2 high_bits, ...; high_mask: 2^high_bits - 1 in every lane). */
static inline __attribute__((always_inline)) __m256i eight_indices(const uint8_t *lo, const uint8_t *hi, int64_t k0,
                                                                   int high_bits, __m256i shifts, __m256i high_mask) {
    const __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lo + k0)));
    if (!high_bits) return at;
    const uint32_t word = high_word(hi, k0, high_bits);
    const __m256i part = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts), high_mask);
    return _mm256_or_si256(at, _mm256_slli_epi32(part, 8));
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
                const __m256i at = _mm256_add_epi32(eight_indices(lo, hi, k0, high_bits, shifts, high_mask), lanes);
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

/* Low-bit rows decoded to fp32, out[dest[i], :] = code * scale + minimum (per group) of row index[i], for i in
   [begin, end): a product with many hidden states (a prompt, a scored text, a batch) decodes the rows of a chunk of
   tokens, which lie in several tiers, once for all of them and hands the block to a GEMM. */
static inline __attribute__((always_inline)) void lowbit_decode_kernel(
    const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, const int64_t *index, const int64_t *dest,
    int64_t begin, int64_t end, int64_t row_count, int64_t row_bytes, const int bits, int64_t columns, int64_t group,
    float *out) {
    const int64_t groups = columns / group, blocks = group / 8;
    const __m256i shifts = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int64_t i = begin; i < end; i++) {
        const int64_t r = index[i];
        const uint8_t *p = codes + r * row_bytes;
        const int whole_words = r + 1 < row_count;
        float *o = out + dest[i] * columns;
        for (int64_t g = 0; g < groups; g++) {
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[r * groups + g]));
            const __m256 m = _mm256_set1_ps(_cvtsh_ss(minimum[r * groups + g]));
            for (int64_t k = 0; k < blocks; k++, p += bits, o += 8)
                _mm256_storeu_ps(o, _mm256_fmadd_ps(decode8(p, bits, whole_words, shifts, mask), s, m));
        }
    }
}

static void lowbit_decode_rows(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,
                               const int64_t *index, const int64_t *dest, int64_t begin, int64_t end,
                               int64_t row_count, int64_t row_bytes, int bits, int64_t columns, int64_t group,
                               float *out) {
#define LOWBIT_DECODE(B) lowbit_decode_kernel(codes, scale, minimum, index, dest, begin, end, row_count, row_bytes, \
                                              B, columns, group, out)
    switch (bits) { case 2: LOWBIT_DECODE(2); break; case 3: LOWBIT_DECODE(3); break;
                    case 4: LOWBIT_DECODE(4); break; default: LOWBIT_DECODE(8); }
#undef LOWBIT_DECODE
}

void lowbit_decode(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, const int64_t *index,
                   const int64_t *dest, int64_t rows, int64_t row_count, int64_t row_bytes, int bits, int64_t columns,
                   int64_t group, float *out, int threads) {
    OVER_ROWS(lowbit_decode_rows(codes, scale, minimum, index, dest, begin, end, row_count, row_bytes, bits, columns,
                                 group, out))
}

/* Codebook rows decoded to fp32, out[dest, k*dim : (k+1)*dim] = scale[r] * codebook[index(r, k)] (codebook as stored,
   (entries, dim)) for rows r = index[i], i in [row_begin, row_end) (index NULL: r = i and dest = i - first): for
   products with more hidden states than the lookup table pays for, since its gathers grow with every hidden state
   while one decoded chunk serves them all in a GEMM. */
static inline __attribute__((always_inline)) void codebook_decode_kernel(
    const uint8_t *low, const uint8_t *high, const uint16_t *scale, const int64_t *index, const int64_t *dest,
    int64_t row_begin, int64_t row_end, int64_t vectors, int64_t high_bytes, int high_bits, const uint16_t *codebook,
    const int64_t dim, int64_t first, float *out) {
    const uint32_t mask = high_bits ? (1u << high_bits) - 1 : 0;
    const __m256i shifts = _mm256_setr_epi32(0, high_bits, 2 * high_bits, 3 * high_bits, 4 * high_bits,
                                             5 * high_bits, 6 * high_bits, 7 * high_bits);
    const __m256i high_mask = _mm256_set1_epi32((int)mask);
    for (int64_t i = row_begin; i < row_end; i++) {
        const int64_t r = index ? index[i] : i;
        const uint8_t *lo = low + r * vectors, *hi = high + r * high_bytes;
        const float s = _cvtsh_ss(scale[r]);
        float *o = out + (index ? dest[i] : i - first) * vectors * dim;
        int64_t k0 = 0;
        if (dim == 4 || dim == 8) { /* eight indices at a time; entries copied and scaled 8 floats a store */
            const __m256 s8 = _mm256_set1_ps(s);
            for (; k0 + 8 <= vectors; k0 += 8) {
                int32_t at[8];
                _mm256_storeu_si256((__m256i *)at, eight_indices(lo, hi, k0, high_bits, shifts, high_mask));
                float *ok = o + k0 * dim;
                for (int j = 0; j < 8; j += dim == 4 ? 2 : 1) {
                    const __m128i halves =
                        dim == 4 ? _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(codebook + at[j] * 4)),
                                                      _mm_loadl_epi64((const __m128i *)(codebook + at[j + 1] * 4)))
                                 : _mm_loadu_si128((const __m128i *)(codebook + at[j] * 8));
                    const __m256 v = _mm256_cvtph_ps(halves);
                    _mm256_storeu_ps(ok + j * dim, _mm256_mul_ps(v, s8));
                }
            }
        }
        for (; k0 < vectors; k0 += 8) {
            const uint32_t word = high_word(hi, k0, high_bits);
            const int64_t k_end = k0 + 8 < vectors ? k0 + 8 : vectors;
            for (int64_t k = k0; k < k_end; k++) {
                const uint16_t *entry = codebook + codebook_index(lo, word, k, k0, high_bits, mask) * dim;
                for (int64_t d = 0; d < dim; d++) o[k * dim + d] = s * _cvtsh_ss(entry[d]);
            }
        }
    }
}

static void codebook_decode_rows(const uint8_t *low, const uint8_t *high, const uint16_t *scale, const int64_t *index,
                                 const int64_t *dest, int64_t row_begin, int64_t row_end, int64_t vectors,
                                 int64_t high_bytes, int high_bits, const uint16_t *codebook, int64_t dim,
                                 int64_t first, float *out) {
#define DECODE(DIM) codebook_decode_kernel(low, high, scale, index, dest, row_begin, row_end, vectors, high_bytes, \
                                           high_bits, codebook, DIM, first, out)
    switch (dim) { case 4: DECODE(4); break; case 8: DECODE(8); break; default: DECODE(dim); }
#undef DECODE
}

/* Rows first .. first + rows (index NULL), or rows index[0 .. rows) into out[dest[i]]. */
void codebook_decode(const uint8_t *low, const uint8_t *high, const uint16_t *scale, const int64_t *index,
                     const int64_t *dest, int64_t first, int64_t rows, int64_t vectors, int64_t high_bytes,
                     int high_bits, const uint16_t *codebook, int64_t dim, float *out, int threads) {
    OVER_ROWS(codebook_decode_rows(low, high, scale, index, dest, index ? begin : first + begin,
                                   index ? end : first + end, vectors, high_bytes, high_bits, codebook, dim, first,
                                   out))
}

/* A tiered embedding's rows (methods/tiered/layer.py), every tier in one call: out[i] = the row of token tokens[i]
   (tokens NULL: token first + i), stored at row slot[token] of the tiers laid one after another. forms holds
   FORM_FIELDS int64s per tier, in stored order: kind, first stored row, rows, four buffer addresses and four sizes
   (see tier_row). A tier of kind FORM_ZERO stores nothing (the caller adds its low-rank part). A token outside the
   vocabulary, or a slot outside the tiers, gets a zero row and is counted: the caller raises. Each row is then
   multiplied by factor (1: not at all). One call for every tier, because calling once per tier from Python costs
   more than decoding a few hundred rows. */
#define FORM_FIELDS 11
enum { FORM_ZERO = 0, FORM_LOWBIT = 1, FORM_CODEBOOK = 2 };

/* Row r of the tier described by f into o: lowbit (codes, scale, minimum; row bytes, bits, group) or codebook
   (low, high, scale, fp16 codebook; vectors, high bytes, high bits, dim). */
static inline void tier_row(const int64_t *f, int64_t r, int64_t width, float *o) {
    const int64_t here = 0;
    if (f[0] == FORM_LOWBIT)
        lowbit_decode_rows((const uint8_t *)f[3], (const uint16_t *)f[4], (const uint16_t *)f[5], &r, &here, 0, 1,
                           f[2], f[7], (int)f[8], width, f[9], o);
    else if (f[0] == FORM_CODEBOOK)
        codebook_decode_rows((const uint8_t *)f[3], (const uint8_t *)f[4], (const uint16_t *)f[5], &r, &here, 0, 1,
                             f[7], f[8], (int)f[9], (const uint16_t *)f[6], f[10], 0, o);
    else
        memset(o, 0, width * sizeof(float));
}

/* Ask for the bytes row r of the tier f will read (its codes, and its scales and minima or its indices' high
   bits and scale) ahead of its turn: the rows of a lookup lie anywhere in the tiers, and one row's decoding is too
   short for the core to reach the next row's misses by itself. */
static inline void tier_prefetch(const int64_t *f, int64_t r, int64_t width) {
    const char *at[3];
    int64_t bytes[3];
    if (f[0] == FORM_LOWBIT) {
        const int64_t groups = width / f[9];
        at[0] = (const char *)f[3] + r * f[7], bytes[0] = f[7];
        at[1] = (const char *)((const uint16_t *)f[4] + r * groups), bytes[1] = 2 * groups;
        at[2] = (const char *)((const uint16_t *)f[5] + r * groups), bytes[2] = 2 * groups;
    } else if (f[0] == FORM_CODEBOOK) {
        at[0] = (const char *)f[3] + r * f[7], bytes[0] = f[7];
        at[1] = (const char *)f[4] + r * f[8], bytes[1] = f[8];
        at[2] = (const char *)((const uint16_t *)f[5] + r), bytes[2] = 2;
    } else
        return;
    for (int part = 0; part < 3; part++)
        for (int64_t line = 0; line < bytes[part]; line += 64) _mm_prefetch(at[part] + line, _MM_HINT_T0);
}

/* The tier of stored row s (forms in stored order, the first starting at 0) and s's row in it: r < 0 or beyond the
   tier's rows where s is outside the tiers. */
static inline const int64_t *tier_of(const int64_t *forms, int tiers, int64_t s, int64_t *r) {
    int t = tiers - 1;
    while (t > 0 && s < forms[t * FORM_FIELDS + 1]) t--;
    *r = s - forms[t * FORM_FIELDS + 1];
    return forms + t * FORM_FIELDS;
}

/* Rows this many tokens ahead are asked for while a row is decoded. */
#define PREFETCH_AHEAD 4

/* o[0 .. width) *= factor: a model's embedding scale (Gemma's sqrt(d)) while the row is still in the cache, the
   same single-precision product as multiplying the decoded rows afterwards. */
static inline void scale_row(float *o, int64_t width, float factor) {
    const __m256 f = _mm256_set1_ps(factor);
    int64_t d = 0;
    for (; d + 8 <= width; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), f));
    for (; d < width; d++) o[d] *= factor;
}

static int64_t tiered_rows(const int32_t *slot, int64_t vocab, const int64_t *tokens, int64_t first, int64_t begin,
                           int64_t end, const int64_t *forms, int tiers, int64_t width, float factor, float *out) {
    int64_t bad = 0;
    for (int64_t i = begin; i < end; i++) {
        if (i + PREFETCH_AHEAD < end) {
            const int64_t token = tokens ? tokens[i + PREFETCH_AHEAD] : first + i + PREFETCH_AHEAD;
            int64_t r;
            if (token >= 0 && token < vocab) {
                const int64_t *f = tier_of(forms, tiers, slot[token], &r);
                if (r >= 0 && r < f[2]) tier_prefetch(f, r, width);
            }
        }
        const int64_t token = tokens ? tokens[i] : first + i;
        const int64_t s = token >= 0 && token < vocab ? slot[token] : -1;
        int64_t r;
        const int64_t *f = tier_of(forms, tiers, s, &r);
        if (s < 0 || r < 0 || r >= f[2]) {
            memset(out + i * width, 0, width * sizeof(float));
            bad++;
            continue;
        }
        tier_row(f, r, width, out + i * width);
        if (factor != 1.0f) scale_row(out + i * width, width, factor);
    }
    return bad;
}

int64_t tiered_decode(const int32_t *slot, int64_t vocab, const int64_t *tokens, int64_t first, int64_t rows,
                      const int64_t *forms, int tiers, int64_t width, float factor, float *out, int threads) {
    int64_t bad = 0;
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(+ : bad)")
    for (int part = 0; part < threads; part++) {
        const int64_t begin = rows * part / threads, end = rows * (part + 1) / threads;
        bad += tiered_rows(slot, vocab, tokens, first, begin, end, forms, tiers, width, factor, out);
    }
    return bad;
}

void codebook_matmul_t(const uint8_t *low, const uint8_t *high, const uint16_t *scale, int64_t rows, int64_t vectors,
                       int64_t high_bytes, int high_bits, const float *table, int64_t entries, int n, float *out,
                       int threads) {
    OVER_ROWS(codebook_rows(low, high, scale, begin, end, vectors, high_bytes, high_bits, table, entries, n, out,
                            rows))
}
"""
