/* twinserve's native CPU kernels: small-batch GEMV over float32, int8 or 4-bit weights. Plain C with
 * optional AVX2/FMA intrinsics, called through ctypes on tensors' data pointers (no torch
 * headers: it builds in about a second). Compiled per machine with the instruction sets it has
 * (see build.py); without AVX2 the scalar loops below run instead. */
#include <math.h>
#include "native.h"
#include "actq.h"

/* ``nt`` weight rows of out for M activation rows: the nt weight rows share each activation
 * load and their nt x M accumulators are independent, so the FMA latency chain does not stall
 * the loop (one accumulator at M = 1 measured no faster than torch's kernel). M and nt are
 * constants in each inlined copy (see tile_rows), so the accumulators stay in registers;
 * is_int8 (mat->kind is MAT_INT8) is one too where the caller is hot (tile_block). */
static inline __attribute__((always_inline)) void tile(const Mat *mat, const float *x, const int64_t M,
                                                      float *out, int64_t ldo, int accumulate,
                                                      int64_t n0, const int nt, const int is_int8) {
    const int64_t K = mat->k;
    const int8_t *q = (const int8_t *)mat->w;
    const float *wf = (const float *)mat->w;
    float acc_s[ROW_CHUNK][NT] = {{0}};
    int64_t k = 0;
#ifdef __AVX2__
    __m256 acc[ROW_CHUNK][NT];
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc[m][t] = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 w[NT];
        for (int t = 0; t < nt; t++) {
            if (is_int8) {
                __m128i b = _mm_loadl_epi64((const __m128i *)(q + (n0 + t) * K + k));
                w[t] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            } else {
                w[t] = _mm256_loadu_ps(wf + (n0 + t) * K + k);
            }
        }
        for (int64_t m = 0; m < M; m++) {
            __m256 xv = _mm256_loadu_ps(x + m * K + k);
            for (int t = 0; t < nt; t++) acc[m][t] = _mm256_fmadd_ps(w[t], xv, acc[m][t]);
        }
    }
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc_s[m][t] = hsum(acc[m][t]);
#endif
    for (; k < K; k++)
        for (int t = 0; t < nt; t++) {
            float w = is_int8 ? (float)q[(n0 + t) * K + k] : wf[(n0 + t) * K + k];
            for (int64_t m = 0; m < M; m++) acc_s[m][t] += w * x[m * K + k];
        }
    for (int t = 0; t < nt; t++) {
        const int64_t n = n0 + t;
        const float s = is_int8 ? ((const float *)mat->scale)[n] : 1.0f;
        const float b = mat->bias ? mat->bias[n] : 0.0f;
        for (int64_t m = 0; m < M; m++) {
            float y = acc_s[m][t] * s + b;
            out[m * ldo + n] = accumulate ? out[m * ldo + n] + y : y;
        }
    }
}

#ifdef __AVX2__
/* int8 weights times int8-rounded activations (actq.h) for one or two rows, where converting
 * every weight to float made the kernel compute-bound: |w| times sign(w) * x in vpmaddubsw
 * (|w| <= 127, so pair sums never saturate), a float multiply-add per group of 32 for the
 * activations' scale and the row's scale at the end. */
static inline void tile_int8q(const Mat *mat, const QRows *qx, const int64_t M, float *out,
                              int64_t ldo, int accumulate, int64_t n0, const int nt) {
    const int64_t K = mat->k, G = K / Q4_GROUP;
    const int8_t *q = (const int8_t *)mat->w;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][NT];
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc[m][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m256i w[NT];
        for (int t = 0; t < nt; t++) w[t] = _mm256_loadu_si256((const __m256i *)(q + (n0 + t) * K + g * Q4_GROUP));
        for (int64_t m = 0; m < M; m++) {
            const __m256i xv = _mm256_load_si256((const __m256i *)(qx->q + m * K + g * Q4_GROUP));
            const __m256 dx = _mm256_set1_ps(qx->scale[m * G + g]);
            for (int t = 0; t < nt; t++) {
                const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w[t], w[t]), _mm256_sign_epi8(xv, w[t]));
                acc[m][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), dx, acc[m][t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        const int64_t n = n0 + t;
        const float s = ((const float *)mat->scale)[n], b = mat->bias ? mat->bias[n] : 0.0f;
        for (int64_t m = 0; m < M; m++) {
            const float y = hsum(acc[m][t]) * s + b;
            out[m * ldo + n] = accumulate ? out[m * ldo + n] + y : y;
        }
    }
}

static void int8q_gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo,
                           int accumulate) {
    QX qx;
    const int64_t tiles = mat->n / NT;
    prepare(x, rows, mat->k, &qx);
    const QRows r = {qx.sums, qx.q, qx.scale};
    #pragma omp for schedule(static) nowait     /* the single below is the barrier */
    for (int64_t i = 0; i < tiles; i++) {
        if (rows == 1) tile_int8q(mat, &r, 1, out, ldo, accumulate, i * NT, NT);
        else for (int t = 0; t < NT; t += 2) tile_int8q(mat, &r, 2, out, ldo, accumulate, i * NT + t, 2);
    }
    #pragma omp single
    for (int64_t n = tiles * NT; n < mat->n; n++) tile_int8q(mat, &r, rows, out, ldo, accumulate, n, 1);
}
#endif

/* Rows [n0, n0 + NT) for one or two activation rows: one row gets NT weight rows per pass
 * (latency hiding), two rows get two. */
static void tile_rows(const Mat *mat, const float *x, int64_t M, float *out, int64_t ldo, int acc,
                      int64_t n0) {
    const int i8 = mat->kind == MAT_INT8;
    if (M == 1) tile(mat, x, 1, out, ldo, acc, n0, 4, i8);
    else for (int t = 0; t < NT; t += 2) tile(mat, x, 2, out, ldo, acc, n0 + t, 2, i8);
}

/* Weight rows [n0, n0 + nt) for all M rows, in register tiles of BLOCK_M rows x nt weight
 * rows: 4 x 3 is 12 accumulators, 3 weights and 1 activation, the 16 ymm registers (1.6x the
 * GMAC/s of 8 rows x 1 weight row on a Zen 4 at 16 rows; 6 x 2, 3 x 4 and 2 x 6 measured
 * slower). Constant row counts per copy, so the accumulators stay in registers. */
#define BLOCK_M 4
#define BLOCK_N 3
static inline __attribute__((always_inline)) void tile_block_kind(
        const Mat *mat, const float *x, int64_t M, float *out, int64_t ldo, int acc, int64_t n0,
        const int nt, const int i8) {
    const int64_t K = mat->k;
    int64_t m0 = 0;
    for (; m0 + BLOCK_M <= M; m0 += BLOCK_M)
        tile(mat, x + m0 * K, BLOCK_M, out + m0 * ldo, ldo, acc, n0, nt, i8);
    switch (M - m0) {
    case 3: tile(mat, x + m0 * K, 3, out + m0 * ldo, ldo, acc, n0, nt, i8); break;
    case 2: tile(mat, x + m0 * K, 2, out + m0 * ldo, ldo, acc, n0, nt, i8); break;
    case 1: tile(mat, x + m0 * K, 1, out + m0 * ldo, ldo, acc, n0, nt, i8); break;
    default: break;
    }
}

static void tile_block(const Mat *mat, const float *x, int64_t M, float *out, int64_t ldo, int acc,
                       int64_t n0, const int nt) {
    if (mat->kind == MAT_INT8) tile_block_kind(mat, x, M, out, ldo, acc, n0, nt, 1);
    else tile_block_kind(mat, x, M, out, ldo, acc, n0, nt, 0);
}

void gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate) {
    if (mat->kind == MAT_Q4) {
        q4_gemv_for(mat, x, rows, out, ldo, accumulate);
        return;
    }
    if (mat->kind == MAT_W8A8 || mat->kind == MAT_Q4V) {      /* int8 activations, xq.h */
        w8a8_gemv_for(mat, x, rows, out, ldo, accumulate);
        return;
    }
#ifdef __AVX2__
    if (mat->kind == MAT_INT8 && rows <= 2 && mat->k % Q4_GROUP == 0 && mat->k <= MAX_K) {
        int8q_gemv_for(mat, x, rows, out, ldo, accumulate);
        return;
    }
#endif
    if (rows <= 2) {
        const int64_t tiles = mat->n / NT;
        #pragma omp for schedule(static) nowait     /* the single below is the barrier */
        for (int64_t i = 0; i < tiles; i++) tile_rows(mat, x, rows, out, ldo, accumulate, i * NT);
        #pragma omp single
        for (int64_t n = tiles * NT; n < mat->n; n++)
            tile(mat, x, rows, out, ldo, accumulate, n, 1, mat->kind == MAT_INT8);
        return;
    }
    const int64_t tiles = mat->n / BLOCK_N;
    #pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < tiles; i++) tile_block(mat, x, rows, out, ldo, accumulate, i * BLOCK_N, BLOCK_N);
    #pragma omp single
    for (int64_t n = tiles * BLOCK_N; n < mat->n; n++) tile_block(mat, x, rows, out, ldo, accumulate, n, 1);
}

/* out [M, n] = x W^T for any Mat (the Python side fills the struct), M <= MAX_ROWS. */
int mat_gemm_small(const Mat *mat, const float *x, int64_t M, float *out, int nthreads) {
    if (M < 1 || M > MAX_ROWS) return -1;
    if (mat->kind == MAT_Q4 && (mat->k % Q4_GROUP || mat->k / Q4_GROUP > MAX_Q4_GROUPS)) return -1;
    if ((mat->kind == MAT_W8A8 || mat->kind == MAT_Q4V) && (mat->n % 16 || mat->k % W8_GROUP)) return -1;
    #pragma omp parallel num_threads(nthreads)
    gemv_for(mat, x, M, out, mat->n, 0);
    return 0;
}

/* native.h's MAX_ROWS, so Python sizes its buffers and batches by it. */
int native_max_rows(void) { return MAX_ROWS; }

/* The ISA this file was compiled for, so Python can report it. */
const char *native_isa(void) {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__)
    return "avx2";
#else
    return "scalar";
#endif
}
