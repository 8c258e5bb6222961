/* Activations rounded to int8 per group of 32 (scale max|x| / 127, as llama.cpp rounds them
 * for its integer kernels), with the exact float sum of each group: what the integer-dot GEMVs
 * (q4.c, and kernels.c's int8 path for one or two rows) multiply the weights with. Each thread
 * keeps its own copy on its stack. */
#ifndef TWINSERVE_ACTQ_H
#define TWINSERVE_ACTQ_H

#include "native.h"

#define MAX_K (MAX_Q4_GROUPS * Q4_GROUP)
#define QX_ROWS 32          /* rows of one QX: ~160 KB of stack; more rows run in chunks */

/* Per-thread copy of the activations' group sums and (AVX2) int8 blocks with their scales. */
typedef struct {
    float sums[QX_ROWS * MAX_Q4_GROUPS];
    int8_t q[QX_ROWS * MAX_K] __attribute__((aligned(32)));
    float scale[QX_ROWS * MAX_Q4_GROUPS];
} QX;

/* The rows of a QX that one register tile reads (a chunk of at most ROW_CHUNK rows). */
typedef struct {
    const float *sums;
    const int8_t *q;
    const float *scale;
} QRows;

#ifdef __AVX2__
static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 32 floats -> 32 int8 (round to nearest) and their scale. */
static inline float quantize_group(const float *x, int8_t *q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    const float m = hmax(amax), d = m / 127.0f, inv = m > 0.0f ? 127.0f / m : 0.0f;
    __m256i i32[4];
    for (int i = 0; i < 4; i++) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
    /* packs work per 128-bit lane: the permute puts the 32 bytes back in order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_store_si256((__m256i *)q, p);
    return d;
}
#endif

static inline void prepare(const float *x, int64_t rows, int64_t K, QX *qx) {
    const int64_t G = K / Q4_GROUP;
    for (int64_t m = 0; m < rows; m++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * Q4_GROUP;
            float s = 0.0f;
            for (int j = 0; j < Q4_GROUP; j++) s += xg[j];
            qx->sums[m * G + g] = s;
#ifdef __AVX2__
            qx->scale[m * G + g] = quantize_group(xg, qx->q + m * K + g * Q4_GROUP);
#endif
        }
}

#endif
