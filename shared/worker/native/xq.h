/* Activations rounded to int8 per group of W8_GROUP for the VNNI kernels (w8a8.c, q4v.c):
 * scale max|x| / 127, round to nearest even; per group also the exact float sum of x (what
 * Q4's zero multiplies, as in q4.c), per row W8A8's +128 correction. Unlike actq.h's stack copy these buffers are
 * heap-allocated, so any k and row count fits. */
#ifndef TWINSERVE_XQ_H
#define TWINSERVE_XQ_H

#include <math.h>
#include <stdlib.h>
#include "native.h"

/* Activation rows as the kernels read them: q int8 [rows, k]; scale and gsum (the float sum of
 * x) [rows, k / W8_GROUP]; corr [rows]: sum over groups of 128 * scale * sum(q), which takes
 * W8A8's +128 back out of exactly what the integer dots added. */
typedef struct {
    int8_t *q;
    float *scale, *gsum, *corr;
    int64_t capacity, rows;   /* rows * k the buffers hold, and rows corr holds */
} XQ;

/* w8a8.c's and q4v.c's register tiles over rounded rows (tiles.h: an orphaned omp for that
 * ends at a barrier). */
void w8a8_tiles_for(const Mat *mat, const XQ *xq, int64_t rows, float *out, int64_t ldo, int acc);
void q4v_tiles_for(const Mat *mat, const XQ *xq, int64_t rows, float *out, int64_t ldo, int acc);
/* A MAT_W8A8 or MAT_Q4V GEMM over many rows (w8a8.c): the threads round x's rows once,
 * together, into xq (sized for them), then multiply; ends at a barrier. */
void w8a8_rows_for(const Mat *mat, XQ *xq, const float *x, int64_t rows, float *out, int64_t ldo,
                   int acc);

static inline void xq_free(XQ *xq) {
    free(xq->q); free(xq->scale); free(xq->gsum); free(xq->corr);
    *xq = (XQ){0};
}

static inline int xq_reserve(XQ *xq, int64_t rows, int64_t k) {
    if (rows * k <= xq->capacity && rows <= xq->rows) return 0;
    xq_free(xq);
    const int64_t groups = rows * k / W8_GROUP + 1;
    xq->q = aligned_alloc(64, (size_t)((rows * k + 63) / 64 * 64));
    xq->scale = malloc(sizeof(float) * (size_t)groups);
    xq->gsum = malloc(sizeof(float) * (size_t)groups);
    xq->corr = malloc(sizeof(float) * (size_t)rows);
    if (!(xq->q && xq->scale && xq->gsum && xq->corr)) {
        xq_free(xq);
        return -1;
    }
    xq->capacity = rows * k;
    xq->rows = rows;
    return 0;
}

#ifdef __AVX512F__
/* One group of 32: q, its sum, the float sum of x and the scale (AVX-512: two vectors). */
static inline float round_group(const float *x, int8_t *q, int32_t *sum, float *fsum) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    *fsum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qb));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    return amax / 127.0f;
}
#else
static inline float round_group(const float *x, int8_t *q, int32_t *sum, float *fsum) {
    float amax = 0.0f, f = 0.0f;
    for (int j = 0; j < W8_GROUP; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
        f += x[j];
    }
    *fsum = f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < W8_GROUP; j++) {
        q[j] = (int8_t)lrintf(x[j] * inv);
        s += q[j];
    }
    *sum = s;
    return amax / 127.0f;
}
#endif

/* Row m of x [rows, k] into the buffers. */
static inline void xq_row(XQ *xq, const float *x, int64_t m, int64_t k) {
    const int64_t G = k / W8_GROUP;
    float corr = 0.0f;
    for (int64_t g = 0; g < G; g++) {
        int32_t sum;
        const float s = round_group(x + m * k + g * W8_GROUP, xq->q + m * k + g * W8_GROUP, &sum,
                                    &xq->gsum[m * G + g]);
        xq->scale[m * G + g] = s;
        corr += s * (float)(128 * sum);
    }
    xq->corr[m] = corr;
}

/* All rows, split between the threads of the enclosing parallel region (ends at its barrier). */
static inline void xq_rows_for(XQ *xq, const float *x, int64_t rows, int64_t k) {
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < rows; m++) xq_row(xq, x, m, k);
}

#endif
