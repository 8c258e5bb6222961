/* GEMV over 4-bit weights in Q4_1 blocks (see native.h): W = q * d + z per group of 32.
 *
 * x . W_row = sum_g d_g (x_g . q_g) + z_g sum(x_g). With AVX2 the activations are quantized per
 * group to int8 (scale max|x| / 127, as llama.cpp does for its Q4 kernels) and x_g . q_g runs on
 * integer multiply-adds (vpmaddubsw: unsigned 4-bit q times signed 8-bit x), 32 weights in
 * five instructions; float conversions per weight made the float kernel compute-bound at a
 * third of the memory bandwidth. The z_g term uses the exact float sums of x. Without AVX2 a
 * scalar float loop runs instead. */
#include <math.h>
#include "native.h"
#include "actq.h"

/* ``nt`` weight rows from n0 for M activation rows (M, nt constants per inlined copy). */
static inline void tile(const Mat *mat, const float *x, const QRows *qx, const int64_t M, float *out,
                        int64_t ldo, int accumulate, int64_t n0, const int nt) {
    const int64_t K = mat->k, G = K / Q4_GROUP;
    const uint8_t *q = (const uint8_t *)mat->w;
    const uint16_t *d = (const uint16_t *)mat->scale, *z = (const uint16_t *)mat->zero;
    float acc_s[ROW_CHUNK][NT] = {{0}};
#ifdef __AVX2__
    (void)x;
    __m256 acc[ROW_CHUNK][NT];
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc[m][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m256i w[NT];
        float dw[NT];
        for (int t = 0; t < nt; t++) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(q + (n0 + t) * (K / 2) + g * 16));
            /* low lane: q[0..15] (low nibbles), high lane: q[16..31] (high nibbles) */
            w[t] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), low4);
            dw[t] = half_to_float(d[(n0 + t) * G + g]);
        }
        for (int64_t m = 0; m < M; m++) {
            const __m256i xv = _mm256_load_si256((const __m256i *)(qx->q + m * K + g * Q4_GROUP));
            const float dx = qx->scale[m * G + g];
            for (int t = 0; t < nt; t++) {
                const __m256i dotp = _mm256_madd_epi16(_mm256_maddubs_epi16(w[t], xv), ones);
                acc[m][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dotp), _mm256_set1_ps(dw[t] * dx), acc[m][t]);
            }
        }
    }
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc_s[m][t] = hsum(acc[m][t]);
#else
    for (int64_t g = 0; g < G; g++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *b = q + (n0 + t) * (K / 2) + g * 16;
            const float dg = half_to_float(d[(n0 + t) * G + g]);
            for (int64_t m = 0; m < M; m++) {
                const float *xg = x + m * K + g * Q4_GROUP;
                float s = 0.0f;
                for (int j = 0; j < 16; j++) s += (float)(b[j] & 15) * xg[j] + (float)(b[j] >> 4) * xg[j + 16];
                acc_s[m][t] += dg * s;
            }
        }
#endif
    for (int t = 0; t < nt; t++) {
        const int64_t n = n0 + t;
        const float bias = mat->bias ? mat->bias[n] : 0.0f;
        for (int64_t m = 0; m < M; m++) {
            float y = acc_s[m][t] + bias;
            for (int64_t g = 0; g < G; g++) y += half_to_float(z[n * G + g]) * qx->sums[m * G + g];
            out[m * ldo + n] = accumulate ? out[m * ldo + n] + y : y;
        }
    }
}

static void tile_rows(const Mat *mat, const float *x, const QRows *qx, int64_t M, float *out,
                      int64_t ldo, int acc, int64_t n0) {
    switch (M) {
    case 1: tile(mat, x, qx, 1, out, ldo, acc, n0, 4); break;
    case 2: for (int t = 0; t < NT; t += 2) tile(mat, x, qx, 2, out, ldo, acc, n0 + t, 2); break;
    case 4: for (int t = 0; t < NT; t++) tile(mat, x, qx, 4, out, ldo, acc, n0 + t, 1); break;
    case 8: for (int t = 0; t < NT; t++) tile(mat, x, qx, 8, out, ldo, acc, n0 + t, 1); break;
    default: for (int t = 0; t < NT; t++) tile(mat, x, qx, M, out, ldo, acc, n0 + t, 1); break;
    }
}

/* rows <= QX_ROWS */
static void q4_gemv_chunk(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo,
                          int accumulate) {
    QX qx;                      /* ~160 KB of stack per thread at the largest K and row count */
    const int64_t tiles = mat->n / NT, K = mat->k, G = K / Q4_GROUP;
    QRows chunks[QX_ROWS / ROW_CHUNK];
    prepare(x, rows, K, &qx);
    for (int64_t m0 = 0; m0 < rows; m0 += ROW_CHUNK)
        chunks[m0 / ROW_CHUNK] = (QRows){qx.sums + m0 * G, qx.q + m0 * K, qx.scale + m0 * G};
    #pragma omp for schedule(static) nowait     /* the single below is the barrier */
    for (int64_t i = 0; i < tiles; i++)
        for (int64_t m0 = 0; m0 < rows; m0 += ROW_CHUNK)
            tile_rows(mat, x + m0 * K, &chunks[m0 / ROW_CHUNK], rows - m0 < ROW_CHUNK ? rows - m0 : ROW_CHUNK,
                      out + m0 * ldo, ldo, accumulate, i * NT);
    #pragma omp single
    for (int64_t n = tiles * NT; n < mat->n; n++)
        for (int64_t m0 = 0; m0 < rows; m0 += ROW_CHUNK)
            tile(mat, x + m0 * K, &chunks[m0 / ROW_CHUNK], rows - m0 < ROW_CHUNK ? rows - m0 : ROW_CHUNK,
                 out + m0 * ldo, ldo, accumulate, n, 1);
}

void q4_gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate) {
    for (int64_t m0 = 0; m0 < rows; m0 += QX_ROWS)
        q4_gemv_chunk(mat, x + m0 * mat->k, rows - m0 < QX_ROWS ? rows - m0 : QX_ROWS, out + m0 * ldo,
                      ldo, accumulate);
}
