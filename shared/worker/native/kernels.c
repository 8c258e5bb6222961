/* twinserve's native CPU kernels: plain C with optional AVX2/FMA intrinsics, called through
 * ctypes on tensors' data pointers (no torch headers: it builds in about a second).
 * Compiled per machine with the instruction sets it has (see build.py); without AVX2 the
 * scalar loops below run instead. OpenMP splits the output rows between threads. */
#include <stdint.h>
#include <math.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define MAX_ROWS 8

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

/* ``nt`` weight rows of out for M activation rows: the nt weight rows share each activation
 * load and their nt x M accumulators are independent, so the FMA latency chain does not stall
 * the loop (one accumulator at M = 1 measured no faster than torch's kernel). M and nt are
 * constants in each inlined copy (see int8_rows), so the accumulators stay in registers. */
#define NT 4
static inline void int8_tile(const float *x, const int64_t M, int64_t K, const int8_t *q,
                             const float *scale, int64_t N, float *out, int64_t n0, const int nt) {
    float acc_s[MAX_ROWS][NT] = {{0}};
    int64_t k = 0;
#ifdef __AVX2__
    __m256 acc[MAX_ROWS][NT];
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) acc[m][t] = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 w[NT];
        for (int t = 0; t < nt; t++) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(q + (n0 + t) * K + k));
            w[t] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
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
        for (int t = 0; t < nt; t++)
            for (int64_t m = 0; m < M; m++) acc_s[m][t] += (float)q[(n0 + t) * K + k] * x[m * K + k];
    for (int64_t m = 0; m < M; m++)
        for (int t = 0; t < nt; t++) out[m * N + n0 + t] = acc_s[m][t] * scale[n0 + t];
}

/* Rows [n0, n0 + NT): one activation row gets NT weight rows per pass (latency hiding); two
 * rows get two; more rows already have M independent accumulators per weight row (and more
 * would spill registers: measured slower). */
static void int8_rows(const float *x, int64_t M, int64_t K, const int8_t *q, const float *scale,
                      int64_t N, float *out, int64_t n0) {
    switch (M) {       /* constants per copy: the compiler unrolls and keeps registers */
    case 1: int8_tile(x, 1, K, q, scale, N, out, n0, 4); break;
    case 2: for (int t = 0; t < NT; t += 2) int8_tile(x, 2, K, q, scale, N, out, n0 + t, 2); break;
    case 4: for (int t = 0; t < NT; t++) int8_tile(x, 4, K, q, scale, N, out, n0 + t, 1); break;
    case 8: for (int t = 0; t < NT; t++) int8_tile(x, 8, K, q, scale, N, out, n0 + t, 1); break;
    default: for (int t = 0; t < NT; t++) int8_tile(x, M, K, q, scale, N, out, n0 + t, 1); break;
    }
}

/* out[m, n] = scale[n] * sum_k x[m, k] * q[n, k] for m < M <= MAX_ROWS: int8 weights,
 * float32 activations. One pass over the weights serves all M rows (the decode case). */
int int8_gemm_small(const float *x, int64_t M, int64_t K, const int8_t *q, const float *scale,
                    int64_t N, float *out, int nthreads) {
    if (M < 1 || M > MAX_ROWS) return -1;
    int64_t tiles = N / NT;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < tiles; i++) int8_rows(x, M, K, q, scale, N, out, i * NT);
    for (int64_t n = tiles * NT; n < N; n++) {       /* the last N % NT rows, one at a time */
        float acc[MAX_ROWS] = {0};
        for (int64_t k = 0; k < K; k++)
            for (int64_t m = 0; m < M; m++) acc[m] += (float)q[n * K + k] * x[m * K + k];
        for (int64_t m = 0; m < M; m++) out[m * N + n] = acc[m] * scale[n];
    }
    return 0;
}

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
