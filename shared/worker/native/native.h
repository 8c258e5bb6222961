/* Shared pieces of twinserve's native CPU kernels (kernels.c, attention.c, decode.c).
 *
 * Functions named *_for contain an orphaned `omp for`: called inside a parallel region they
 * split their work between its threads (one fork per step instead of one per operation);
 * called outside one they run on the calling thread. */
#ifndef TWINSERVE_NATIVE_H
#define TWINSERVE_NATIVE_H

#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include "vec.h"

#define MAX_GROUP 16        /* query heads per KV head (attention.c) */
#define MAX_DIM 256         /* head dim (attention.c, decode.c) */
#define MAX_ROWS 64         /* activation rows of the small-batch GEMV and the fused decode */
#define ROW_CHUNK 8         /* rows per register tile: larger batches run in chunks of it */

/* A weight matrix y = x W^T (+ bias), W [n, k] in one of five layouts (kind):
 *   MAT_F32   w float32 [n, k]
 *   MAT_INT8  w int8 [n, k], W = w * scale[n] (float32 per output row)
 *   MAT_Q4    groups of Q4_GROUP along k, W = q * scale + zero (float16 [n, k / Q4_GROUP] each);
 *             w uint8 [n, k / 2]: per group 16 bytes, byte j holds q[j] (low nibble) and
 *             q[j + 16] (high nibble), the block layout of GGUF's Q4_1
 *   MAT_W8A8  W = (w - 128) * scale[n], w uint8 in 16-row blocks (w8a8.c), times activations
 *             rounded to int8 per W8_GROUP; n % 16 == 0, k % W8_GROUP == 0
 *   MAT_Q4V   MAT_Q4's numbers in 16-row blocks for VNNI (q4v.c), scale holding d and z, times
 *             activations rounded as MAT_W8A8's; n % 16 == 0, k % 32 == 0 */
enum { MAT_F32 = 0, MAT_INT8 = 1, MAT_Q4 = 2, MAT_W8A8 = 3, MAT_Q4V = 4 };
#define W8_GROUP 32
#define Q4_GROUP 32
#define MAX_Q4_GROUPS 128     /* k <= 4096: the per-thread activation copy lives on the stack */
typedef struct {
    const void *w;
    const void *scale;
    const void *zero;       /* MAT_Q4 only */
    const float *bias;      /* [n] or NULL */
    int64_t n, k;
    int32_t kind;
} Mat;

/* out[m, :] (= or +=) x[m, :] W^T for m < rows, the n output columns split between threads. */
void gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate);
/* MAT_W8A8 or MAT_Q4V: int8 activations (xq.h) through w8a8.c or q4v.c. */
void w8a8_gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate);
void q4_gemv_for(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo, int accumulate);
#define NT 4                /* weight rows per GEMV tile */

/* One query row per (token, kv head): ``q`` [tokens, heads, dim] attends the first ctx[t] keys of
 * its sequence through block table row ``tables + table_row[t] * max_blocks``; out has q's
 * shape. Caches are
 * [blocks, block_size, kv_heads, dim], float32 (kv_bf16 = 0) or bfloat16 (kv_bf16 = 1). */
typedef struct {
    const void *k_cache, *v_cache;
    const int32_t *tables;
    int64_t max_blocks, block_size, heads, kv_heads, dim;
    int32_t kv_bf16;
    float scale;
} PagedKV;

/* Long contexts with few (token, kv head) pairs are split into position ranges when
 * ``scratch`` (``capacity`` partial results, see attention.c) is given; NULL: no split. */
void attend_split_for(const PagedKV *kv, const float *q, int64_t tokens, const int32_t *table_row,
                      const int32_t *ctx, float *out, float *scratch, int64_t capacity, int nthreads);

/* bf16 is the top half of a float32: widening is a shift; narrowing rounds to nearest even
 * (as torch's .to(torch.bfloat16), so the eager and fused paths store the same bits). */
static inline void bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    int64_t d = 0;
#ifdef __AVX2__
    for (; d + 8 <= n; d += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + d)));
        _mm256_storeu_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
#endif
    for (; d < n; d++) {
        const uint32_t bits = (uint32_t)src[d] << 16;
        __builtin_memcpy(dst + d, &bits, 4);
    }
}

static inline void f32_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t d = 0; d < n; d++) {
        uint32_t bits;
        __builtin_memcpy(&bits, src + d, 4);
        dst[d] = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
}

#ifdef __F16C__
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    float f;
    if (exp == 0) {                                 /* zero or subnormal: man * 2^-24 */
        f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
#endif



#endif
