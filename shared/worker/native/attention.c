/* Paged attention that reads K/V in place through the block table: no gathered copy, no
 * padding to the longest row, GQA without repeating K/V (the query heads of one KV head share
 * each key and value load), online softmax over tiles of positions. A long context with few
 * (token, kv head) pairs is split into position ranges whose partial softmax states are merged
 * afterwards (flash-decoding), so two threads still share one sequence's work. */
#include <math.h>
#include <string.h>
#include "native.h"
#include "attn512.h"

#define TILE 32             /* positions scored before each softmax rescale (attn512.h: 32) */

/* Partial softmax state of one (token, kv head, position range): per query head of the group
 * its running max, running sum and unnormalised output. */
typedef struct { float mx[MAX_GROUP], sum[MAX_GROUP]; } State;

/* Element offsets of positions [p0, p0 + n) of KV head g in the cache: one division per
 * tile, not one per row. */
static void tile_offsets(const PagedKV *kv, const int32_t *tbl, int64_t g, int64_t p0, int64_t n,
                         int64_t *off) {
    const int64_t bs = kv->block_size, stride = kv->kv_heads * kv->dim;
    int64_t b = p0 / bs, slot = p0 % bs;
    for (int64_t i = 0; i < n; i++) {
        off[i] = ((int64_t)tbl[b] * bs + slot) * stride + g * kv->dim;
        if (++slot == bs) { slot = 0; b++; }
    }
}

/* Pointers to a tile's key or value rows as float32: float32 caches in place, bf16 ones
 * widened into ``buf`` [TILE, dim]. */
static void tile_rows(const PagedKV *kv, const void *cache, const int64_t *off, int64_t n,
                      float *buf, const float **rows) {
    const int64_t D = kv->dim;
    for (int64_t i = 0; i < n; i++) {
        if (!kv->kv_bf16) {
            rows[i] = (const float *)cache + off[i];
            continue;
        }
        bf16_to_f32((const uint16_t *)cache + off[i], buf + i * D, D);
        rows[i] = buf + i * D;
    }
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

/* s[i] = q . k_i * scale for the tile's n keys. Eight keys at a time have eight independent
 * accumulators (one dot product alone is a chain of dependent FMAs: latency-bound). */
static void scores(const float *q, const float *const *k, int64_t n, int64_t D, float scale,
                   float *s) {
    int64_t i = 0;
#ifdef __AVX2__
    if (D % 8 == 0)
        for (; i + 8 <= n; i += 8) {
            __m256 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
            for (int64_t c = 0; c < D; c += 8) {
                const __m256 qv = _mm256_loadu_ps(q + c);
                for (int r = 0; r < 8; r++)
                    acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(k[i + r] + c), qv, acc[r]);
            }
            _mm256_storeu_ps(s + i, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
        }
#endif
    for (; i < n; i++) s[i] = dot_f32(q, k[i], D) * scale;
}

/* s[i] = exp(s[i] - m) for i < n, and their sum; s is padded with zeros up to a multiple of 8. */
static float exp_shifted(float *s, int64_t n, float m) {
    int64_t i = 0;
    float sum = 0.0f;
#ifdef __AVX2__
    for (int64_t p = n; p % 8; p++) s[p] = -INFINITY;
    __m256 acc = _mm256_setzero_ps();
    const __m256 mv = _mm256_set1_ps(m);
    for (; i < n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        if (i + 8 > n)          /* the padding: exactly zero, not e^-86 */
            e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                    _mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum(acc);
#endif
    for (; i < n; i++) { s[i] = expf(s[i] - m); sum += s[i]; }
    return sum;
}

/* acc[j, :] += sum_i p[j][i] * v_i over the tile's n rows. Two 8-wide column chunks at a time
 * for up to four heads: 2 x group independent accumulators stay in registers across the rows. */
static void accumulate_values(const float *const *v, int64_t n, int64_t D, float p[][TILE],
                              int64_t G, float *acc) {
    int64_t c = 0;
#ifdef __AVX2__
    if (G <= 4)
        for (; c + 16 <= D; c += 16) {
            __m256 a[4][2];
            for (int64_t j = 0; j < G; j++)
                for (int h = 0; h < 2; h++) a[j][h] = _mm256_loadu_ps(acc + j * D + c + 8 * h);
            for (int64_t i = 0; i < n; i++) {
                const __m256 v0 = _mm256_loadu_ps(v[i] + c), v1 = _mm256_loadu_ps(v[i] + c + 8);
                for (int64_t j = 0; j < G; j++) {
                    const __m256 pj = _mm256_set1_ps(p[j][i]);
                    a[j][0] = _mm256_fmadd_ps(pj, v0, a[j][0]);
                    a[j][1] = _mm256_fmadd_ps(pj, v1, a[j][1]);
                }
            }
            for (int64_t j = 0; j < G; j++)
                for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc + j * D + c + 8 * h, a[j][h]);
        }
    if (c == D) return;
#endif
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < G; j++)
            if (c == 0) axpy(acc + j * D, p[j][i], v[i], D);
            else for (int64_t d = c; d < D; d++) acc[j * D + d] += p[j][i] * v[i][d];
}

static inline void scale_rows(float *x, float c, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(c)));
#endif
    for (; i < n; i++) x[i] *= c;
}

/* Head j's tile scores s[0..n) folded into its running softmax state; s becomes the weights. */
static void softmax_update(float *s, int64_t n, int64_t D, float *acc, State *st, int64_t j) {
    float m = st->mx[j];
    for (int64_t i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
    if (m > st->mx[j]) {            /* rescale what came before (nothing on the first tile) */
        const float corr = expf(st->mx[j] - m);
        st->sum[j] *= corr;
        scale_rows(acc + j * D, corr, D);
        st->mx[j] = m;
    }
    st->sum[j] += exp_shifted(s, n, m);
}

/* Positions [p0, p0 + n) (n <= TILE, across blocks) folded into the running softmax state. */
static void attend_tile(const PagedKV *kv, const float *qh, const int32_t *tbl, int64_t g,
                        int64_t p0, int64_t n, float *acc, State *st) {
    const int64_t G = kv->heads / kv->kv_heads, D = kv->dim;
    float s[MAX_GROUP][TILE];
    int64_t off[TILE];
    tile_offsets(kv, tbl, g, p0, n, off);
#ifdef __AVX512F__
    if (D == A512_DIM && G <= A512_GROUP) {
        const char *kc = kv->k_cache, *vc = kv->v_cache;
        if (kv->kv_bf16) scores512(kc, off, n, qh, G, kv->scale, 1, s);
        else scores512(kc, off, n, qh, G, kv->scale, 0, s);
        for (int64_t j = 0; j < G; j++) softmax_update(s[j], n, D, acc, st, j);
        if (kv->kv_bf16) values512(vc, off, n, s, G, 1, acc);
        else values512(vc, off, n, s, G, 0, acc);
        return;
    }
#endif
    float buf[TILE * MAX_DIM];
    const float *rows[TILE];
    tile_rows(kv, kv->k_cache, off, n, buf, rows);
    for (int64_t j = 0; j < G; j++) {
        scores(qh + j * D, rows, n, D, kv->scale, s[j]);
        softmax_update(s[j], n, D, acc, st, j);
    }
    tile_rows(kv, kv->v_cache, off, n, buf, rows);
    accumulate_values(rows, n, D, s, G, acc);
}

/* Positions [lo, hi) of one (token, kv head), TILE at a time: acc [group, dim] and st start
 * empty. */
static void attend_range(const PagedKV *kv, const float *qh, const int32_t *tbl, int64_t g,
                         int64_t lo, int64_t hi, float *acc, State *st) {
    const int64_t G = kv->heads / kv->kv_heads, D = kv->dim;
    for (int64_t j = 0; j < G; j++) { st->mx[j] = -INFINITY; st->sum[j] = 0.0f; }
    memset(acc, 0, sizeof(float) * G * D);
    for (int64_t p0 = lo; p0 < hi; p0 += TILE)
        attend_tile(kv, qh, tbl, g, p0, hi - p0 < TILE ? hi - p0 : TILE, acc, st);
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
