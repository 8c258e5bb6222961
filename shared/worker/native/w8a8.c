/* W8A8: int8 weights (per output row scales) times activations rounded to int8 per group of
 * W8_GROUP along k (dynamic: scale max|x| / 127, round to nearest even), int32 sums within a
 * group, float across groups. One scale per token lost 3-5% perplexity on SmolLM2-135M (its
 * activations have outlier channels); groups of 32 lose 0.8% (compare.quality).
 *
 * MAT_W8A8 layout: w uint8 [n / 16][k / 4][16][4] holds W + 128. One 64-byte vector is 4
 * consecutive k of 16 output rows: what vpdpbusd (unsigned times signed bytes, 4 products into
 * each of 16 int32 lanes) multiplies with one broadcast int32 of 4 activation bytes, so a
 * register tile needs no horizontal sums. The +128 comes back out per activation row: 128 times
 * the sum of each group's q, times the group's scale (XQ.corr, xq.h). scale: float32 [n].
 * Without AVX512-VNNI a scalar loop computes the same (Python sends W8A8 to torch there). */
#include "native.h"
#include "actq.h"
#include "xq.h"

#define LANES 16
#define TILE_M 4            /* activation rows x weight blocks per register tile: 12 int32 + */
#define TILE_B 3            /* 12 float accumulators and 3 weight vectors of the 32 zmm */

static inline float finish(const Mat *mat, const XQ *xq, int64_t m, int64_t n, float acc) {
    const float y = (acc - xq->corr[m]) * ((const float *)mat->scale)[n];
    return mat->bias ? y + mat->bias[n] : y;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* M activation rows from m0 times NB blocks of 16 weight rows from block b0 (both constants per
 * inlined copy, so the accumulators stay in registers). */
static inline __attribute__((always_inline)) void tile(const Mat *mat, const XQ *xq, int64_t m0,
                                                      const int M, int64_t b0, const int NB,
                                                      float *out, int64_t ldo, int accumulate) {
    const int64_t K = mat->k, G = K / W8_GROUP;
    const uint8_t *w = (const uint8_t *)mat->w + b0 * LANES * K;
    __m512 accf[TILE_M][TILE_B];
    __m512i acci[TILE_M][TILE_B], wv[TILE_B];
    for (int m = 0; m < M; m++)
        for (int t = 0; t < NB; t++) accf[m][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        for (int m = 0; m < M; m++)
            for (int t = 0; t < NB; t++) acci[m][t] = _mm512_setzero_si512();
        for (int64_t k = g * W8_GROUP; k < (g + 1) * W8_GROUP; k += 4) {
            for (int t = 0; t < NB; t++) wv[t] = _mm512_loadu_si512((const void *)(w + t * LANES * K + k * LANES));
            for (int m = 0; m < M; m++) {
                const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(xq->q + (m0 + m) * K + k));
                for (int t = 0; t < NB; t++) acci[m][t] = _mm512_dpbusd_epi32(acci[m][t], wv[t], xb);
            }
        }
        for (int m = 0; m < M; m++) {
            const __m512 s = _mm512_set1_ps(xq->scale[(m0 + m) * G + g]);
            for (int t = 0; t < NB; t++) accf[m][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[m][t]), s, accf[m][t]);
        }
    }
    for (int m = 0; m < M; m++)
        for (int t = 0; t < NB; t++) {
            const int64_t n0 = (b0 + t) * LANES;
            float y[LANES], *o = out + (m0 + m) * ldo + n0;
            _mm512_storeu_ps(y, accf[m][t]);
            for (int l = 0; l < LANES; l++) {
                const float v = finish(mat, xq, m0 + m, n0 + l, y[l]);
                o[l] = accumulate ? o[l] + v : v;
            }
        }
}
#else
static void tile(const Mat *mat, const XQ *xq, int64_t m0, const int M, int64_t b0, const int NB,
                 float *out, int64_t ldo, int accumulate) {
    const int64_t K = mat->k, G = K / W8_GROUP;
    const uint8_t *w = (const uint8_t *)mat->w;
    for (int m = 0; m < M; m++)
        for (int64_t n = b0 * LANES; n < (b0 + NB) * LANES; n++) {
            const uint8_t *wb = w + (n / LANES) * LANES * K + (n % LANES) * 4;
            const int8_t *q = xq->q + (m0 + m) * K;
            float acc = 0.0f;
            for (int64_t g = 0; g < G; g++) {
                int32_t dot = 0;
                for (int64_t k = g * W8_GROUP; k < (g + 1) * W8_GROUP; k++)
                    dot += (int32_t)wb[(k / 4) * LANES * 4 + k % 4] * q[k];
                acc += (float)dot * xq->scale[(m0 + m) * G + g];
            }
            float *o = out + (m0 + m) * ldo + n;
            const float v = finish(mat, xq, m0 + m, n, acc);
            *o = accumulate ? *o + v : v;
        }
}
#endif

#define TILES_FOR w8a8_tiles_for
#include "tiles.h"

static void multiply_for(const Mat *mat, const XQ *xq, int64_t rows, float *out, int64_t ldo,
                         int accumulate) {
    if (mat->kind == MAT_Q4V) q4v_tiles_for(mat, xq, rows, out, ldo, accumulate);
    else w8a8_tiles_for(mat, xq, rows, out, ldo, accumulate);
}

/* Inside the fused decode step: every thread rounds the (at most MAX_ROWS) rows itself into its
 * own buffer, which costs less than a barrier; the buffer lives as long as the thread. */
static __thread XQ thread_xq;

void w8a8_gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate) {
    XQ *xq = &thread_xq;
    if (xq_reserve(xq, MAX_ROWS > rows ? MAX_ROWS : rows, MAX_K > mat->k ? MAX_K : mat->k))
        abort();    /* no 256 KB for this thread: returning would leave the others at a barrier */
    for (int64_t m = 0; m < rows; m++) xq_row(xq, x, m, mat->k);
    multiply_for(mat, xq, rows, out, ldo, accumulate);
}

void w8a8_rows_for(const Mat *mat, XQ *xq, const float *x, int64_t rows, float *out, int64_t ldo,
                   int accumulate) {
    xq_rows_for(xq, x, rows, mat->k);
    multiply_for(mat, xq, rows, out, ldo, accumulate);
}

/* out [M, n] = x W^T for any M and a MAT_W8A8 or MAT_Q4V weight. */
int mat_gemm_w8a8(const Mat *mat, const float *x, int64_t M, float *out, int nthreads) {
    if ((mat->kind != MAT_W8A8 && mat->kind != MAT_Q4V) || M < 1 || mat->n % LANES || mat->k % W8_GROUP)
        return -1;
    XQ xq = {0};
    if (xq_reserve(&xq, M, mat->k)) return -1;
    #pragma omp parallel num_threads(nthreads)
    w8a8_rows_for(mat, &xq, x, M, out, mat->n, 0);
    xq_free(&xq);
    return 0;
}

/* 1 where this build runs W8A8 on VNNI (Python routes W8A8 batches to torch otherwise). */
int native_has_vnni(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}
