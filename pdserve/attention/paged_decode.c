/* Decode attention over the paged KV pool, one pass over each sequence's keys and values.
 *
 * The pool is one float32 tensor [blocks, layers, 2 (k, v), block_size, kv_heads, head_dim].
 * Each sequence's positions are read in order, all KV heads of a position at once (they lie
 * side by side), so every key and value is read from memory once per layer, front to back:
 *
 *   scores[g][t] = q[b, h*G + g] . k[t] * scale          t < lens[b], k at tables[b][t / BS]
 *   p[g][t]      = softmax over t of scores[g]
 *   out[b, h*G + g] = sum over t of p[g][t] * v[t]
 *
 * Sequences are split over `threads` POSIX threads. Built and loaded by
 * pdserve/attention/native_decode.py; the caller checks every block id and length first.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16

typedef struct {
    const float *pool, *q;
    float *out;
    const int64_t *tables, *lens;
    int64_t table_stride, heads, kv_heads, head_dim, block_size;
    int64_t block_stride, layer_offset, value_shift, max_len;
    float scale;
    int64_t first, last; /* sequences [first, last) of this thread */
    int status;
} Work;

/* Lane-wise partial sums: vectorised without reassociating the float additions. */
static float dot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float sum = 0.0f;
    for (int j = 0; j < LANES; j++) sum += acc[j];
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void softmax_rows(float *scores, int64_t rows, int64_t len) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = scores + r * len, top = s[0], total = 0.0f;
        for (int64_t t = 1; t < len; t++) top = s[t] > top ? s[t] : top;
        for (int64_t t = 0; t < len; t++) total += (s[t] = expf(s[t] - top));
        float inv = 1.0f / total;
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
    }
}

/* Position t's keys of every KV head: kv_heads * head_dim contiguous floats (its values follow
 * value_shift floats later), so a block's keys are read front to back. */
static const float *keys_at(const Work *w, const int64_t *table, int64_t t) {
    int64_t block = table[t / w->block_size];
    return w->pool + block * w->block_stride + w->layer_offset + (t % w->block_size) * w->kv_heads * w->head_dim;
}

/* At a block's first position: ask for the next block's keys (or values) while these compute. */
static void prefetch_next(const Work *w, const int64_t *table, int64_t t, int64_t len, int64_t shift) {
    if (t % w->block_size != 0 || t + w->block_size >= len) return;
    const char *next = (const char *)(keys_at(w, table, t + w->block_size) + shift);
    int64_t bytes = w->block_size * w->kv_heads * w->head_dim * (int64_t)sizeof(float);
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(next + i, 0, 3);
}

static void attend_sequence(const Work *w, int64_t b, float *scores) {
    int64_t heads = w->heads, group = heads / w->kv_heads, dim = w->head_dim, len = w->lens[b];
    const int64_t *table = w->tables + b * w->table_stride;
    const float *q = w->q + b * heads * dim;
    float *out = w->out + b * heads * dim;
    for (int64_t t = 0; t < len; t++) {
        const float *k = keys_at(w, table, t);
        prefetch_next(w, table, t, len, 0);
        for (int64_t h = 0; h < heads; h++)
            scores[h * len + t] = dot(q + h * dim, k + (h / group) * dim, dim) * w->scale;
    }
    softmax_rows(scores, heads, len);
    memset(out, 0, sizeof(float) * heads * dim);
    for (int64_t t = 0; t < len; t++) {
        const float *v = keys_at(w, table, t) + w->value_shift;
        prefetch_next(w, table, t, len, w->value_shift);
        for (int64_t h = 0; h < heads; h++) {
            const float p = scores[h * len + t], *vh = v + (h / group) * dim;
            float *o = out + h * dim;
            for (int64_t d = 0; d < dim; d++) o[d] += p * vh[d];
        }
    }
}

static void *run(void *arg) {
    Work *w = (Work *)arg;
    float *scores = malloc(sizeof(float) * w->heads * (w->max_len > 0 ? w->max_len : 1));
    if (!scores) {
        w->status = -1;
        return NULL;
    }
    for (int64_t b = w->first; b < w->last; b++) attend_sequence(w, b, scores);
    free(scores);
    w->status = 0;
    return NULL;
}

/* Returns 0, or -1 when memory or a thread could not be had (nothing is then valid in out). */
int pdserve_paged_decode(const float *pool, const float *q, float *out, const int64_t *tables,
                         int64_t table_stride, const int64_t *lens, int64_t batch, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t num_layers,
                         int64_t layer, float scale, int64_t max_len, int64_t threads) {
    if (kv_heads < 1 || heads % kv_heads != 0) return -1;
    int64_t layer_size = 2 * block_size * kv_heads * head_dim;
    if (threads < 1) threads = 1;
    if (threads > batch) threads = batch > 0 ? batch : 1;
    Work base = {pool, q, out, tables, lens, table_stride, heads, kv_heads, head_dim, block_size,
                 num_layers * layer_size, layer * layer_size, block_size * kv_heads * head_dim,
                 max_len, scale, 0, 0, 0};
    Work work[threads];
    pthread_t ids[threads];
    int started[threads];
    for (int64_t i = 0; i < threads; i++) {
        work[i] = base;
        work[i].first = batch * i / threads;
        work[i].last = batch * (i + 1) / threads;
        started[i] = i > 0 && pthread_create(&ids[i], NULL, run, &work[i]) == 0;
        if (i > 0 && !started[i]) run(&work[i]); /* no thread: this one computes it */
    }
    run(&work[0]);
    int status = work[0].status;
    for (int64_t i = 1; i < threads; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        status |= work[i].status;
    }
    return status;
}
