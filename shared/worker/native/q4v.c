/* Q4_1 weights times int8 activations on AVX512-VNNI: the 4-bit kernel for CPUs that have it.
 *
 * W = q * d + z per group of 32 input channels (q 0..15, d and z float16: GGUF's Q4_1, so the
 * default model's own blocks, exactly); activations rounded to int8 per group of 32 (xq.h).
 * x . W_row = sum_g (d_g sx_g (q_g . qx_g) + z_g sum(x_g)), the zero point times the exact float
 * sum of the group (as q4.c): vpdpbusd takes the unsigned nibbles as they are. q4.c multiplies the same blocks with
 * AVX2's vpmaddubsw one weight row at a time and runs out of instructions before memory
 * bandwidth at one activation row; here one 64-byte load feeds 16 weight rows.
 *
 * MAT_Q4V layout (16 weight rows to a block, as w8a8.c): w uint8 [n / 16][k / 32][4][16][4];
 * in vector j of a group, lane l's 4 bytes hold q[l][4j + p] (low nibbles) and
 * q[l][4j + 16 + p] (high nibbles), p < 4. scale float16 [n / 16][k / 32][2][16]: d then z of
 * the block's 16 rows. 5 bits a weight, as Q4_1. */
#include "native.h"
#include "xq.h"

#define LANES 16
#define TILE_M 4            /* activation rows x weight blocks per register tile */
#define TILE_B 2
#define GROUP_BYTES (4 * 64)

static inline void store(const Mat *mat, int64_t n0, const float *y, float *o, int accumulate) {
    for (int l = 0; l < LANES; l++) {
        const float v = mat->bias ? y[l] + mat->bias[n0 + l] : y[l];
        o[l] = accumulate ? o[l] + v : v;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* M activation rows from m0 times NB weight blocks from b0 (constants per inlined copy). */
static inline __attribute__((always_inline)) void tile(const Mat *mat, const XQ *xq, int64_t m0,
                                                      const int M, int64_t b0, const int NB,
                                                      float *out, int64_t ldo, int accumulate) {
    const int64_t K = mat->k, G = K / W8_GROUP;
    const uint8_t *w = (const uint8_t *)mat->w + b0 * G * GROUP_BYTES;
    const uint16_t *sz = (const uint16_t *)mat->scale + b0 * G * 2 * LANES;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 accf[TILE_M][TILE_B];
    __m512i acci[TILE_M][TILE_B];
    for (int m = 0; m < M; m++)
        for (int t = 0; t < NB; t++) accf[m][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        for (int m = 0; m < M; m++)
            for (int t = 0; t < NB; t++) acci[m][t] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            __m512i lo[TILE_B], hi[TILE_B];
            for (int t = 0; t < NB; t++) {
                const __m512i v = _mm512_loadu_si512((const void *)(w + (t * G + g) * GROUP_BYTES + j * 64));
                lo[t] = _mm512_and_si512(v, low4);
                hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
            for (int m = 0; m < M; m++) {
                const int8_t *qx = xq->q + (m0 + m) * K + g * W8_GROUP + 4 * j;
                const __m512i xl = _mm512_set1_epi32(*(const int32_t *)qx);
                const __m512i xh = _mm512_set1_epi32(*(const int32_t *)(qx + 16));
                for (int t = 0; t < NB; t++)
                    acci[m][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acci[m][t], lo[t], xl), hi[t], xh);
            }
        }
        for (int t = 0; t < NB; t++) {
            const __m512i h = _mm512_loadu_si512((const void *)(sz + (t * G + g) * 2 * LANES));
            const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
            const __m512 z = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
            for (int m = 0; m < M; m++) {
                const int64_t i = (m0 + m) * G + g;
                const __m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(xq->scale[i]));
                accf[m][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[m][t]), ds, accf[m][t]);
                accf[m][t] = _mm512_fmadd_ps(z, _mm512_set1_ps(xq->gsum[i]), accf[m][t]);
            }
        }
    }
    for (int m = 0; m < M; m++)
        for (int t = 0; t < NB; t++) {
            float y[LANES];
            _mm512_storeu_ps(y, accf[m][t]);
            store(mat, (b0 + t) * LANES, y, out + (m0 + m) * ldo + (b0 + t) * LANES, accumulate);
        }
}
#else
/* The same sums in plain C: what a build without VNNI computes (tests check the layout on it). */
static void tile(const Mat *mat, const XQ *xq, int64_t m0, const int M, int64_t b0, const int NB,
                 float *out, int64_t ldo, int accumulate) {
    const int64_t K = mat->k, G = K / W8_GROUP;
    for (int t = 0; t < NB; t++) {
        const uint8_t *w = (const uint8_t *)mat->w + (b0 + t) * G * GROUP_BYTES;
        const uint16_t *sz = (const uint16_t *)mat->scale + (b0 + t) * G * 2 * LANES;
        for (int m = 0; m < M; m++) {
            const int8_t *qx = xq->q + (m0 + m) * K;
            float y[LANES] = {0};
            for (int64_t g = 0; g < G; g++)
                for (int l = 0; l < LANES; l++) {
                    int32_t dot = 0;
                    for (int j = 0; j < 4; j++)
                        for (int p = 0; p < 4; p++) {
                            const uint8_t b = w[g * GROUP_BYTES + j * 64 + l * 4 + p];
                            dot += (b & 15) * qx[g * W8_GROUP + 4 * j + p] + (b >> 4) * qx[g * W8_GROUP + 4 * j + 16 + p];
                        }
                    const int64_t i = (m0 + m) * G + g;
                    y[l] += half_to_float(sz[g * 2 * LANES + l]) * xq->scale[i] * (float)dot
                            + half_to_float(sz[g * 2 * LANES + LANES + l]) * xq->gsum[i];
                }
            store(mat, (b0 + t) * LANES, y, out + (m0 + m) * ldo + (b0 + t) * LANES, accumulate);
        }
    }
}
#endif

#define TILES_FOR q4v_tiles_for
#include "tiles.h"
