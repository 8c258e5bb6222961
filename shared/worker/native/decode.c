/* A whole forward step of a Llama-family model in one call: every layer's RMSNorm, q/k/v GEMM,
 * RoPE, KV-cache write, paged attention, output GEMM plus residual, RMSNorm, gate/up GEMM,
 * SiLU * up and down GEMM plus residual, for up to Scratch.rows tokens of any mix: decode rows,
 * prompt tokens, chunks over a cached prefix (each token a row with its sequence's block-table
 * row and the keys it sees; all of a step's K/V are written before any row attends). One
 * OpenMP region for the whole step, from the embedding lookup to the final RMSNorm; the
 * stages meet at the barriers of their `omp for`s. Python keeps the RoPE tables and the
 * lm_head: torch ops between weight-streaming C calls ran several times their warm time. float32
 * activations; caches float32 or bfloat16 (kv_bf16: half the bytes attention reads per context
 * token); weights in any of native.h's layouts. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "native.h"
#include "xq.h"

/* Built with -DTWINSERVE_STAGE_TIMES (compare.step_profile's build), thread 0 adds the time
 * since its previous mark to the stage it just finished: each stage's share of the step,
 * barrier waits included. Other builds compile the marks away. */
enum { ST_FORK, ST_EMBED, ST_IN_NORM, ST_QKV, ST_ROPE, ST_ATTN, ST_O, ST_POST_NORM, ST_GATE_UP,
       ST_SILU, ST_DOWN, ST_FINAL_NORM, ST_JOIN, NUM_STAGES };
#ifdef TWINSERVE_STAGE_TIMES
static double stage_seconds[NUM_STAGES], stage_last;
static int64_t stage_calls;
#define STAGE_DONE(i) do { if (omp_get_thread_num() == 0) { const double t_ = omp_get_wtime(); \
    stage_seconds[i] += t_ - stage_last; stage_last = t_; } } while (0)
#define STAGE_START() (stage_last = omp_get_wtime(), stage_calls++)
#else
#define STAGE_DONE(i) ((void)0)
#define STAGE_START() ((void)0)
#endif

/* Copies and clears the stage seconds and the calls they cover into out [NUM_STAGES + 1];
 * returns NUM_STAGES, or 0 in a build without the timers. */
int native_stage_times(double *out) {
#ifdef TWINSERVE_STAGE_TIMES
    for (int i = 0; i < NUM_STAGES; i++) { out[i] = stage_seconds[i]; stage_seconds[i] = 0; }
    out[NUM_STAGES] = (double)stage_calls;
    stage_calls = 0;
    return NUM_STAGES;
#else
    (void)out;
    return 0;
#endif
}

typedef struct {
    const float *in_norm, *post_norm;
    const float *q_norm, *k_norm;       /* per-head [dim] RMSNorm weights (Qwen3) or NULL */
    Mat qkv, o, gate_up, down;
    void *k_cache, *v_cache;            /* [blocks, block_size, kv_heads, dim] */
    int32_t kv_bf16;                    /* caches are bfloat16 (else float32) */
} Layer;

typedef struct {
    int64_t hidden, heads, kv_heads, dim, inter, num_layers;
    float eps, scale;
} Dims;

/* One step's inputs and output (FusedDecode fills one per model and updates it per step). */
typedef struct {
    float *h;                   /* [rows, hidden]: the final-normed hidden states on return */
    int64_t rows;
    const int64_t *ids;         /* token ids: h starts as their rows of embed */
    const float *embed;         /* [vocab, hidden] */
    const float *final_norm;    /* [hidden] */
    const float *cos, *sin;     /* RoPE tables [*, dim]: row m rotates by row rope_row[m] */
    const int64_t *rope_row;    /* (its position into a per-model table, or m per step) */
    const int64_t *slots;       /* row m's K/V go to cache slot slots[m] */
    const int32_t *tables;      /* block tables [sequences, max_blocks] */
    int64_t max_blocks, block_size;
    const int32_t *table_row, *ctx;     /* row m: its block-table row, the keys it sees */
} StepIO;

/* Per step, sized by the caller for up to `rows` rows; x holds max(rows, threads x MAX_ROWS)
 * rows (rmsnorm_step: a slice of MAX_ROWS rows per thread for small steps). */
typedef struct {
    float *x, *qkv, *q, *attn, *gate_up, *act, *split;
    int64_t split_capacity, rows;
} Scratch;

/* out = w * r / rms(r); out may be r (Qwen3's per-head norms, in place). */
static inline void norm_row(const float *r, const float *w, float *out, int64_t n, float eps) {
    const float inv = 1.0f / sqrtf(dot_f32(r, r, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (r[i] * inv);
}

/* Up to MAX_ROWS rows every thread normalises all of them itself into its own slice of s->x,
 * so the GEMM that reads them needs no barrier first (at batch 1 a shared norm left one thread
 * waiting while the other normalised the only row); more rows are split between the threads
 * (the redundant work would cost more than the barrier). */
static const float *rmsnorm_step(const float *h, const float *w, const Scratch *s, int64_t rows,
                                 int64_t n, float eps) {
    if (rows > MAX_ROWS) {          /* the same branch in every thread: the omp for is shared */
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < rows; m++) norm_row(h + m * n, w, s->x + m * n, n, eps);
        return s->x;
    }
    float *out = s->x + (int64_t)omp_get_thread_num() * MAX_ROWS * n;
    for (int64_t m = 0; m < rows; m++) norm_row(h + m * n, w, out + m * n, n, eps);
    return out;
}

/* Above MAX_ROWS the int8-activation kernels round the rows once, split between the threads,
 * into the step's shared buffer (gemv_for would have every thread round all of them). */
static void gemm_step(const Mat *mat, const float *x, int64_t rows, float *out, int64_t ldo,
                      int accumulate, XQ *shared) {
    if (rows <= MAX_ROWS || (mat->kind != MAT_W8A8 && mat->kind != MAT_Q4V)) {
        gemv_for(mat, x, rows, out, ldo, accumulate);
        return;
    }
    w8a8_rows_for(mat, shared, x, rows, out, ldo, accumulate);
}

/* Rotate-half RoPE of one head into dst: dst = x * cos + cat(-x2, x1) * sin. */
static void rope(const float *x, const float *cos, const float *sin, int64_t d, float *dst) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        dst[i] = x[i] * cos[i] - x[i + half] * sin[i];
        dst[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
}

/* q heads -> rotated into s->q; k heads -> rotated into the cache slot; v heads -> the slot. */
static void rope_store_for(const Dims *dm, const Layer *L, const Scratch *s, const StepIO *io) {
    const int64_t rows = io->rows, *slots = io->slots;
    const int64_t H = dm->heads, KVH = dm->kv_heads, D = dm->dim, width = (H + 2 * KVH) * D;
    #pragma omp for schedule(static)
    for (int64_t item = 0; item < rows * (H + 2 * KVH); item++) {
        const int64_t m = item / (H + 2 * KVH), head = item % (H + 2 * KVH);
        float *x = s->qkv + m * width + head * D;
        const float *c = io->cos + io->rope_row[m] * D, *sn = io->sin + io->rope_row[m] * D;
        if (head < H) {
            if (L->q_norm) norm_row(x, L->q_norm, x, D, dm->eps);
            rope(x, c, sn, D, s->q + (m * H + head) * D);
        } else if (head < H + KVH) {
            if (L->k_norm) norm_row(x, L->k_norm, x, D, dm->eps);
            const int64_t at = (slots[m] * KVH + head - H) * D;
            if (!L->kv_bf16) {
                rope(x, c, sn, D, (float *)L->k_cache + at);
                continue;
            }
            float k[MAX_DIM];
            rope(x, c, sn, D, k);
            f32_to_bf16(k, (uint16_t *)L->k_cache + at, D);
        } else {
            const int64_t at = (slots[m] * KVH + head - H - KVH) * D;
            if (L->kv_bf16) f32_to_bf16(x, (uint16_t *)L->v_cache + at, D);
            else memcpy((float *)L->v_cache + at, x, sizeof(float) * D);
        }
    }
}

/* SiLU(gate) * up in chunks of SILU_CHUNK (so one row still splits across threads); exp256
 * rather than expf per element, where the scalar exp was ~15% of a 64-row step. exp256's
 * clamp keeps g / (1 + e^-g) finite at both ends. */
#define SILU_CHUNK 256
static void silu_mul_for(const float *gu, float *out, int64_t rows, int64_t inter) {
    const int64_t chunks = (inter + SILU_CHUNK - 1) / SILU_CHUNK;
    #pragma omp for schedule(static)
    for (int64_t item = 0; item < rows * chunks; item++) {
        const int64_t m = item / chunks, j0 = item % chunks * SILU_CHUNK;
        const int64_t end = j0 + SILU_CHUNK < inter ? j0 + SILU_CHUNK : inter;
        const float *g = gu + m * 2 * inter, *u = g + inter;
        float *o = out + m * inter;
        int64_t j = j0;
#ifdef __AVX2__
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; j + 8 <= end; j += 8) {
            const __m256 gv = _mm256_loadu_ps(g + j);
            const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(sv, _mm256_loadu_ps(u + j)));
        }
#endif
        for (; j < end; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

static void layer_for(const Dims *dm, const Layer *L, const PagedKV *kv, const Scratch *s,
                      const StepIO *io, XQ *xq, int nthreads) {
    const int64_t hid = dm->hidden, rows = io->rows;
    float *h = io->h;
    const float *x = rmsnorm_step(h, L->in_norm, s, rows, hid, dm->eps);
    STAGE_DONE(ST_IN_NORM);
    gemm_step(&L->qkv, x, rows, s->qkv, L->qkv.n, 0, xq);
    STAGE_DONE(ST_QKV);
    rope_store_for(dm, L, s, io);
    STAGE_DONE(ST_ROPE);
    attend_split_for(kv, s->q, rows, io->table_row, io->ctx, s->attn, s->split, s->split_capacity,
                     nthreads);
    STAGE_DONE(ST_ATTN);
    gemm_step(&L->o, s->attn, rows, h, hid, 1, xq);
    STAGE_DONE(ST_O);
    x = rmsnorm_step(h, L->post_norm, s, rows, hid, dm->eps);
    STAGE_DONE(ST_POST_NORM);
    gemm_step(&L->gate_up, x, rows, s->gate_up, L->gate_up.n, 0, xq);
    STAGE_DONE(ST_GATE_UP);
    silu_mul_for(s->gate_up, s->act, rows, dm->inter);
    STAGE_DONE(ST_SILU);
    gemm_step(&L->down, s->act, rows, h, hid, 1, xq);
    STAGE_DONE(ST_DOWN);
}

/* Row m of io->h is a token of the sequence whose block table is tables[table_row[m]]; it
 * attends to that sequence's first ctx[m] keys (its position + 1) and its own K/V go to
 * slots[m]. The embedding rows and the final norm are split between the threads like any
 * other stage (a barrier each, before the first layer and at the region's end). */
int decode_forward(const Dims *dm, const Layer *layers, const StepIO *io, const Scratch *s,
                   int nthreads) {
    const int64_t rows = io->rows, hid = dm->hidden;
    if (rows < 1 || rows > s->rows || dm->heads % dm->kv_heads || dm->dim > MAX_DIM) return -1;
    XQ xq = {0};
    const int64_t k = dm->inter > hid ? dm->inter : hid;
    if (rows > MAX_ROWS && xq_reserve(&xq, rows, k > dm->heads * dm->dim ? k : dm->heads * dm->dim))
        return -1;
    STAGE_START();
    #pragma omp parallel num_threads(nthreads)
    {
        STAGE_DONE(ST_FORK);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < rows; m++)
            memcpy(io->h + m * hid, io->embed + io->ids[m] * hid, sizeof(float) * hid);
        STAGE_DONE(ST_EMBED);
        for (int64_t i = 0; i < dm->num_layers; i++) {
            const Layer *L = layers + i;
            const PagedKV kv = {L->k_cache, L->v_cache, io->tables, io->max_blocks, io->block_size,
                                dm->heads, dm->kv_heads, dm->dim, L->kv_bf16, dm->scale};
            layer_for(dm, L, &kv, s, io, &xq, nthreads);
        }
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < rows; m++)
            norm_row(io->h + m * hid, io->final_norm, io->h + m * hid, hid, dm->eps);
        STAGE_DONE(ST_FINAL_NORM);
    }
    STAGE_DONE(ST_JOIN);      /* outside the region: the caller's thread is thread 0 */
    xq_free(&xq);
    return 0;
}
