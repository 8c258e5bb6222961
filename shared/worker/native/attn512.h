/* The AVX-512 tile of attention.c for head dim 64 with up to 4 query heads per KV head
 * (SmolLM2, Llama 3.2). Each K and V row is loaded once for all query heads of its group,
 * bf16 rows widen in registers (no copy), and the group's output stays in 16 registers across
 * the tile's value rows: the generic tile reads a V row once per 16 columns and widens bf16
 * rows through a buffer, which left the kernel well short of the memory's speed. */
#ifndef TWINSERVE_ATTN512_H
#define TWINSERVE_ATTN512_H
#if defined(__AVX512F__)
#include <immintrin.h>

#define A512_DIM 64
#define A512_GROUP 4

/* Columns [16c, 16c + 16) of a cache row as float32. */
static inline __m512 row16(const void *row, int c, int bf16) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + 16 * c))), 16));
    return _mm512_loadu_ps((const float *)row + 16 * c);
}

static inline __m256 fold256(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* The horizontal sums of four vectors, as the lanes of one. */
static inline __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 ab = _mm256_hadd_ps(fold256(a), fold256(b));
    const __m256 cd = _mm256_hadd_ps(fold256(c), fold256(d));
    const __m256 x = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
}

/* s[j][i] = q_j . k_i * scale for the n (<= tile) rows at `off` of k_cache; four keys at a
 * time so their dot products run as independent chains. Entries up to n rounded to 4 are
 * written (the tile's buffer has room). */
static inline __attribute__((always_inline)) void scores512(
        const char *cache, const int64_t *off, int64_t n, const float *q, int64_t G, float scale,
        int bf16, float s[][32]) {
    const int64_t esize = bf16 ? 2 : 4;
    for (int64_t i = 0; i < n; i += 4) {
        __m512 t[A512_GROUP][4];
        for (int r = 0; r < 4; r++) {
            const char *row = cache + off[i + r < n ? i + r : i] * esize;
            __m512 k[4];
            for (int c = 0; c < 4; c++) k[c] = row16(row, c, bf16);
            for (int j = 0; j < A512_GROUP; j++) {
                if (j >= G) break;
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q + j * A512_DIM), k[0]);
                for (int c = 1; c < 4; c++)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * A512_DIM + 16 * c), k[c], acc);
                t[j][r] = acc;
            }
        }
        for (int j = 0; j < A512_GROUP; j++) {
            if (j >= G) break;
            _mm_storeu_ps(s[j] + i, _mm_mul_ps(hsum4x16(t[j][0], t[j][1], t[j][2], t[j][3]),
                                               _mm_set1_ps(scale)));
        }
    }
}

/* acc[j, :] += sum_i p[j][i] * v_i over the n rows at `off` of v_cache. */
static inline __attribute__((always_inline)) void values512(
        const char *cache, const int64_t *off, int64_t n, float p[][32], int64_t G, int bf16,
        float *acc) {
    const int64_t esize = bf16 ? 2 : 4;
    __m512 a[A512_GROUP][4];
    for (int j = 0; j < A512_GROUP; j++)
        for (int c = 0; c < 4; c++)
            a[j][c] = j < G ? _mm512_loadu_ps(acc + j * A512_DIM + 16 * c) : _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i++) {
        const char *row = cache + off[i] * esize;
        __m512 v[4];
        for (int c = 0; c < 4; c++) v[c] = row16(row, c, bf16);
        for (int j = 0; j < A512_GROUP; j++) {
            if (j >= G) break;
            const __m512 pj = _mm512_set1_ps(p[j][i]);
            for (int c = 0; c < 4; c++) a[j][c] = _mm512_fmadd_ps(pj, v[c], a[j][c]);
        }
    }
    for (int j = 0; j < A512_GROUP; j++) {
        if (j >= G) break;
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + j * A512_DIM + 16 * c, a[j][c]);
    }
}

#endif
#endif
