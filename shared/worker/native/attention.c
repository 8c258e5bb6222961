/* Paged attention that reads K/V in place through the block table: no gathered copy, no
 * padding to the longest row, GQA without repeating K/V (the query heads of one KV head share
 * each key and value load), online softmax over tiles of positions. A long context with few
 * (token, kv head) pairs is split into position ranges whose partial softmax states are merged
 * afterwards (flash-decoding), so two threads still share one sequence's work. */
#include <math.h>
#include <string.h>
#include "native.h"

#define TILE 32             /* positions scored before each softmax rescale */
#define MAX_GROUP 16        /* query heads per KV head */
#define MAX_DIM 256

/* Partial softmax state of one (token, kv head, position range): per query head of the group
 * its running max, running sum and unnormalised output. */
typedef struct { float mx[MAX_GROUP], sum[MAX_GROUP]; } State;

/* Row i of a tile whose first row is at ``base`` (rows ``stride`` elements apart): float32
 * caches are read in place, bf16 ones widened into ``buf``. */
static inline const float *kv_row(const PagedKV *kv, const void *base, int64_t i, int64_t stride,
                                  float *buf) {
    if (!kv->kv_bf16) return (const float *)base + i * stride;
    const uint16_t *src = (const uint16_t *)base + i * stride;
    for (int64_t d = 0; d < kv->dim; d++) {       /* bf16 is the top half of a float32 */
        uint32_t bits = (uint32_t)src[d] << 16;
        memcpy(buf + d, &bits, 4);
    }
    return buf;
}

static inline void axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    __m256 av = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

/* acc[j, :] += sum_i p[j][i] * v_i over the tile's n rows, one 8-wide column chunk at a time so
 * the group's accumulators stay in registers across the rows. */
static void accumulate_values(const PagedKV *kv, const void *vbase, int64_t n, int64_t stride,
                              float p[][TILE], int64_t G, float *acc) {
    const int64_t D = kv->dim;
    float buf[MAX_DIM];
    int64_t c = 0;
#ifdef __AVX2__
    if (!kv->kv_bf16 && G <= 8) {
        for (; c + 8 <= D; c += 8) {
            __m256 a[8];
            for (int64_t j = 0; j < G; j++) a[j] = _mm256_loadu_ps(acc + j * D + c);
            for (int64_t i = 0; i < n; i++) {
                const __m256 v = _mm256_loadu_ps((const float *)vbase + i * stride + c);
                for (int64_t j = 0; j < G; j++) a[j] = _mm256_fmadd_ps(_mm256_set1_ps(p[j][i]), v, a[j]);
            }
            for (int64_t j = 0; j < G; j++) _mm256_storeu_ps(acc + j * D + c, a[j]);
        }
        if (c == D) return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        const float *v = kv_row(kv, vbase, i, stride, buf);
        for (int64_t j = 0; j < G; j++)
            for (int64_t d = c; d < D; d++) acc[j * D + d] += p[j][i] * v[d];
    }
}

/* Scores of one tile (n <= TILE consecutive slots of one block) folded into the running
 * softmax state: s[j][i] becomes the tile's exp weights. */
static void score_tile(const PagedKV *kv, const float *qh, const void *kbase, int64_t n,
                       int64_t stride, int64_t G, float s[][TILE], float *acc, State *st) {
    const int64_t D = kv->dim;
    float buf[MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const float *k = kv_row(kv, kbase, i, stride, buf);
        for (int64_t j = 0; j < G; j++) s[j][i] = dot_f32(qh + j * D, k, D) * kv->scale;
    }
    for (int64_t j = 0; j < G; j++) {
        float m = st->mx[j];
        for (int64_t i = 0; i < n; i++) m = s[j][i] > m ? s[j][i] : m;
        if (m > st->mx[j]) {            /* rescale what came before (nothing on the first tile) */
            const float corr = expf(st->mx[j] - m);
            st->sum[j] *= corr;
            for (int64_t d = 0; d < D; d++) acc[j * D + d] *= corr;
            st->mx[j] = m;
        }
        for (int64_t i = 0; i < n; i++) { s[j][i] = expf(s[j][i] - m); st->sum[j] += s[j][i]; }
    }
}

/* Positions [lo, hi) of one (token, kv head), block by block (no per-position division):
 * acc [group, dim] and st start empty. */
static void attend_range(const PagedKV *kv, const float *qh, const int32_t *tbl, int64_t g,
                         int64_t lo, int64_t hi, float *acc, State *st) {
    const int64_t G = kv->heads / kv->kv_heads, D = kv->dim, bs = kv->block_size;
    const int64_t stride = kv->kv_heads * D, elem = kv->kv_bf16 ? 2 : 4;
    float s[MAX_GROUP][TILE];
    for (int64_t j = 0; j < G; j++) { st->mx[j] = -INFINITY; st->sum[j] = 0.0f; }
    memset(acc, 0, sizeof(float) * G * D);
    for (int64_t p0 = lo; p0 < hi;) {
        const int64_t block_end = (p0 / bs + 1) * bs, end = block_end < hi ? block_end : hi;
        const int64_t n = end - p0 < TILE ? end - p0 : TILE;
        const int64_t row = ((int64_t)tbl[p0 / bs] * bs + p0 % bs) * stride + g * D;
        score_tile(kv, qh, (const char *)kv->k_cache + row * elem, n, stride, G, s, acc, st);
        accumulate_values(kv, (const char *)kv->v_cache + row * elem, n, stride, s, G, acc);
        p0 += n;
    }
}

/* Merge `parts` partial states into out [group, dim] (normalised). */
static void merge(int64_t G, int64_t D, const float *accs, const State *sts, int64_t parts,
                  float *out, int64_t head_stride) {
    for (int64_t j = 0; j < G; j++) {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t p = 0; p < parts; p++) m = sts[p].mx[j] > m ? sts[p].mx[j] : m;
        float *o = out + j * head_stride;
        memset(o, 0, sizeof(float) * D);
        for (int64_t p = 0; p < parts; p++) {
            if (sts[p].sum[j] == 0.0f) continue;            /* an empty range */
            const float w = expf(sts[p].mx[j] - m);
            sum += sts[p].sum[j] * w;
            axpy(o, w, accs + (p * G + j) * D, D);
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < D; d++) o[d] *= inv;
    }
}

/* Splits per (token, kv head) pair: with few pairs, enough ranges (each at least two tiles
 * long) for 4 items per thread, rounded so the items divide evenly between the threads, within
 * the scratch's `capacity` items. */
static int64_t num_splits(int64_t pairs, int64_t max_ctx, int64_t capacity, int nthreads) {
    if (pairs >= 4 * nthreads) return 1;
    const int64_t by_len = (max_ctx + 2 * TILE - 1) / (2 * TILE);
    int64_t s = (4 * nthreads + pairs - 1) / pairs;
    while ((s * pairs) % nthreads && s < 4 * nthreads && (s + 1) * pairs <= capacity) s++;
    if (s > by_len) s = by_len;
    if (s * pairs > capacity) s = capacity / pairs;
    return s < 1 ? 1 : s;
}

/* scratch: `capacity` items of group * dim floats, then `capacity` States. */
void attend_split_for(const PagedKV *kv, const float *q, int64_t tokens, const int32_t *table_row,
                      const int32_t *ctx, float *out, float *scratch, int64_t capacity, int nthreads) {
    const int64_t G = kv->heads / kv->kv_heads, D = kv->dim, KVH = kv->kv_heads;
    int64_t max_ctx = 0;
    for (int64_t t = 0; t < tokens; t++) max_ctx = ctx[t] > max_ctx ? ctx[t] : max_ctx;
    const int64_t S = scratch ? num_splits(tokens * KVH, max_ctx, capacity, nthreads) : 1;
    State *states = (State *)(scratch + capacity * G * D);
    #pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < tokens * KVH * S; item++) {
        const int64_t t = item / (KVH * S), g = (item / S) % KVH, part = item % S;
        const int64_t L = ctx[t], lo = L * part / S, hi = L * (part + 1) / S;
        const int32_t *tbl = kv->tables + (int64_t)table_row[t] * kv->max_blocks;
        const float *qh = q + (t * kv->heads + g * G) * D;
        float local[MAX_GROUP * MAX_DIM];
        State st;
        float *acc = S > 1 ? scratch + item * G * D : local;
        attend_range(kv, qh, tbl, g, lo, hi, acc, S > 1 ? states + item : &st);
        if (S == 1) merge(G, D, acc, &st, 1, out + (t * kv->heads + g * G) * D, D);
    }
    if (S == 1) return;
    #pragma omp for schedule(static)
    for (int64_t pair = 0; pair < tokens * KVH; pair++) {
        const int64_t t = pair / KVH, g = pair % KVH;
        merge(G, D, scratch + pair * S * G * D, states + pair * S, S,
              out + (t * kv->heads + g * G) * D, D);
    }
}

/* The standalone entry (torch attention backend): returns -1 for shapes it cannot hold. */
int paged_attention(const PagedKV *kv, const float *q, int64_t tokens, const int32_t *table_row,
                    const int32_t *ctx, float *out, float *scratch, int64_t capacity, int nthreads) {
    if (kv->heads % kv->kv_heads || kv->heads / kv->kv_heads > MAX_GROUP || kv->dim > MAX_DIM)
        return -1;
    #pragma omp parallel num_threads(nthreads)
    attend_split_for(kv, q, tokens, table_row, ctx, out, scratch, capacity, nthreads);
    return 0;
}
