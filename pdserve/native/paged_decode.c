/* Decode attention over the paged KV pool, one pass over each sequence's keys and values.
 *
 * The pool is one tensor [blocks, layers, 2 (k, v), block_size, kv_heads, head_dim] of float32,
 * bfloat16 or float16 (the `_bf16` and `_f16` entry points; float16 where the compiler has
 * _Float16): keys and values are widened to float32 as they are loaded and every sum is float32,
 * so a half pool reads half the bytes and computes as a float32 one over the same values.
 * Each sequence's positions are read in order, all KV heads of a position at once (they lie
 * side by side), so every key and value is read from memory once per layer, front to back:
 *
 *   scores[g][t] = q[b, h*G + g] . k[t] * scale          t < lens[b], k at tables[b][t / BS]
 *   p[g][t]      = softmax over t of scores[g]
 *   out[b, h*G + g] = sum over t of p[g][t] * v[t]
 *
 * With head_dim a multiple of SEGMENT (16 floats where built for AVX-512, else 8; head_dim up to
 * 16 SEGMENTs: 64 and 128 in most models) a sequence is computed in segments of up to SEGMENT
 * positions of one block. The query heads of one KV head go together in a span (as many as 16
 * vectors of query or sums hold), so each key and value is loaded once per span: a span scores
 * all SEGMENT positions (one shuffle tree sums each head's lanes), then, after the
 * softmax, sums the segment's values into registers. While a segment computes, the next segments'
 * keys and values (AHEAD of them, across sequences) are asked for into L2 a part at a time, so
 * memory streams during the arithmetic instead of between it. Any other head_dim goes one position
 * at a time, asking for the segments ahead the same way. Sequences are split over `threads` POSIX threads. The queries may be strided (views of
 * the fused projection's output). pdserve_write_kv copies a layer's new keys and values into the
 * pool. Loaded by paged_decode.py; the caller checks every block id, slot and length first.
 *
 * pdserve_paged_attend_from: the same with each sequence's first position `starts[b]` (a window:
 * t from starts[b] to lens[b]). NOTE: a sequence's result is a function of its query, its
 * positions' keys and values, its start and length and the block size only (segments end at
 * t + SEGMENT, its block's end or its length; one thread computes it), never of the other sequences
 * or the thread count: the deterministic mode attends every query, prefill rows too, through it.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define AHEAD 2         /* segments asked for ahead of the one computing */
#define SPAN_VECTORS 16 /* a span's query (or sum) vectors: half the registers of AVX-512 */
#define SPAN_HEADS 4    /* the most query heads in a span */
/* positions per segment: one score vector, a register of the build's instruction set (16-float
 * vectors on AVX2, two registers each, made the kernel 2.7x slower at 256 rows of context 128) */
#ifdef __AVX512F__
#define SEGMENT 16
#else
#define SEGMENT 8
#endif

/* The pool's element kinds. Every function below that reads or writes the pool takes its kind as
 * a constant where it is inlined, so each kind compiles to its own loops. */
enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2 };

static inline int64_t kind_size(const int kind) { return kind == KV_F32 ? 4 : 2; }

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest, ties to even (as torch converts); a NaN stays a NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* float16: the F16C instructions where the target has them (every AVX2 part), else the compiler's
 * _Float16 (whose conversions, without F16C, are calls: a float16 pool then reads slower than a
 * float32 one). */
#if defined(__F16C__)
#include <immintrin.h>
#define HAVE_F16 1
static inline float f16_to_float(uint16_t h) { return _cvtsh_ss(h); }

static inline uint16_t float_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__FLT16_MAX__)
#define HAVE_F16 1
static inline float f16_to_float(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}

static inline uint16_t float_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, sizeof h);
    return h;
}
#endif

/* Element i of a pool row of `kind`, as a float. */
static inline __attribute__((always_inline)) float kv_at(const unsigned char *row, int64_t i, const int kind) {
    uint16_t h;
    if (kind == KV_F32) {
        float f;
        memcpy(&f, row + 4 * i, sizeof f);
        return f;
    }
    memcpy(&h, row + 2 * i, sizeof h);
#ifdef HAVE_F16
    if (kind == KV_F16) return f16_to_float(h);
#endif
    return bf16_to_float(h);
}

typedef struct {
    const unsigned char *pool; /* elements of `kind` */
    const float *q;
    int64_t q_stride; /* floats from one sequence's query heads to the next's */
    float *out;
    const int64_t *tables, *lens;
    int64_t table_stride, heads, kv_heads, head_dim, block_size;
    int64_t block_stride, layer_offset, value_shift, max_len;
    float scale;
    int64_t first, last; /* sequences [first, last) of this thread */
    const int64_t *starts; /* each sequence's first position; NULL: 0 */
    int status;
    int kind; /* the pool's elements: KV_F32, KV_BF16, KV_F16 */
} Work;

/* Sequence b's first position. */
static inline int64_t start_of(const Work *w, int64_t b) { return w->starts ? w->starts[b] : 0; }

/* Lane-wise partial sums of a query and a pool row of `kind`: vectorised without reassociating
 * the float additions. */
static inline __attribute__((always_inline)) float dot(const float *a, const unsigned char *b, int64_t n,
                                                       const int kind) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * kv_at(b, i + j, kind);
    float sum = 0.0f;
    for (int j = 0; j < LANES; j++) sum += acc[j];
    for (; i < n; i++) sum += a[i] * kv_at(b, i, kind);
    return sum;
}

/* Each of `rows` score rows (`stride` floats apart) turned into probabilities over its first len. */
static void softmax_rows(float *scores, int64_t rows, int64_t len, int64_t stride) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = scores + r * stride, top = s[0], total = 0.0f;
        for (int64_t t = 1; t < len; t++) top = s[t] > top ? s[t] : top;
        for (int64_t t = 0; t < len; t++) total += (s[t] = expf(s[t] - top));
        float inv = 1.0f / total;
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
    }
}

/* Position t's keys of every KV head: kv_heads * head_dim contiguous elements (its values follow
 * value_shift elements later), so a block's keys are read front to back. */
static inline const unsigned char *keys_at(const Work *w, const int64_t *table, int64_t t) {
    int64_t block = table[t / w->block_size];
    return w->pool + (block * w->block_stride + w->layer_offset + (t % w->block_size) * w->kv_heads * w->head_dim) *
                         kind_size(w->kind);
}

/* Where a row's values lie, from its keys. */
static inline const unsigned char *values_of(const Work *w, const unsigned char *keys) {
    return keys + w->value_shift * kind_size(w->kind);
}

/* The end of the segment starting at t: SEGMENT positions on, the end of t's block, or len. */
static inline int64_t segment_end(const Work *w, int64_t t, int64_t len) {
    int64_t end = t + SEGMENT, block_end = (t / w->block_size + 1) * w->block_size;
    end = end < block_end ? end : block_end;
    return end < len ? end : len;
}

/* The next segment whose keys and values are asked for ahead of use. */
typedef struct {
    int64_t b, t;
} Cursor;

static inline void cursor_next(const Work *w, Cursor *c) {
    if (c->b >= w->last) return;
    c->t = segment_end(w, c->t, w->lens[c->b]);
    while (c->b < w->last && c->t >= w->lens[c->b])
        if (++c->b < w->last) c->t = start_of(w, c->b);
}

/* The keys' and values' cache lines of the segment at a cursor, asked for a part at a time while
 * the segment before computes. */
typedef struct {
    uintptr_t first, shift, lines; /* lines = 0: nothing left to ask for */
} Lines;

static inline Lines segment_lines(const Work *w, Cursor c) {
    Lines none = {0, 0, 0};
    if (c.b >= w->last) return none;
    int64_t bytes = (segment_end(w, c.t, w->lens[c.b]) - c.t) * w->kv_heads * w->head_dim * kind_size(w->kind);
    uintptr_t k = (uintptr_t)keys_at(w, w->tables + c.b * w->table_stride, c.t), first = k & ~(uintptr_t)63;
    Lines lines = {first, (uintptr_t)(w->value_shift * kind_size(w->kind)), (k + bytes - first + 63) / 64};
    return lines;
}

/* Part `part` of `parts` of the lines. */
static inline void prefetch_part(const Lines *l, int64_t part, int64_t parts) {
    for (uintptr_t i = l->lines * part / parts; i < l->lines * (part + 1) / parts; i++) {
        __builtin_prefetch((const void *)(l->first + 64 * i), 0, 2); /* into L2 */
        __builtin_prefetch((const void *)(l->first + l->shift + 64 * i), 0, 2);
    }
}

/* Any head_dim: one position at a time, the query heads of each KV head against its key. At
 * each segment's first position the segment AHEAD on is asked for, as the segment path does. */
static inline __attribute__((always_inline)) void attend_positions(const Work *w, int64_t b, float *scores,
                                                                   Cursor *ahead, const int kind) {
    int64_t heads = w->heads, group = heads / w->kv_heads, dim = w->head_dim, len = w->lens[b];
    const int64_t *table = w->tables + b * w->table_stride;
    const float *q = w->q + b * w->q_stride;
    float *out = w->out + b * heads * dim;
    int64_t start = start_of(w, b);
    for (int64_t t = start, end = start; t < len; t++) {
        if (t == end) {
            end = segment_end(w, t, len);
            Lines next = segment_lines(w, *ahead);
            prefetch_part(&next, 0, 1);
            cursor_next(w, ahead);
        }
        const unsigned char *k = keys_at(w, table, t);
        for (int64_t h = 0; h < heads; h++)
            scores[h * w->max_len + t] = dot(q + h * dim, k + (h / group) * dim * kind_size(kind), dim, kind) * w->scale;
    }
    softmax_rows(scores + start, heads, len - start, w->max_len);
    memset(out, 0, sizeof(float) * heads * dim);
    for (int64_t t = start; t < len; t++) {
        const unsigned char *v = values_of(w, keys_at(w, table, t));
        for (int64_t h = 0; h < heads; h++) {
            const float p = scores[h * w->max_len + t];
            const unsigned char *vh = v + (h / group) * dim * kind_size(kind);
            float *o = out + h * dim;
            for (int64_t d = 0; d < dim; d++) o[d] += p * kv_at(vh, d, kind);
        }
    }
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define HAVE_SEGMENTS 1
#endif
#endif

#ifdef HAVE_SEGMENTS
/* SEGMENT-float vectors (GCC and clang vector extensions): one AVX-512 or AVX2 register, two NEON
 * ones. */
typedef float vseg __attribute__((vector_size(SEGMENT * sizeof(float))));

static inline vseg load_seg(const float *p) {
    vseg v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_seg(float *p, vseg v) { memcpy(p, &v, sizeof v); }

typedef uint16_t vhalf __attribute__((vector_size(SEGMENT * sizeof(uint16_t))));
typedef uint32_t vword __attribute__((vector_size(SEGMENT * sizeof(uint32_t))));
#if defined(HAVE_F16) && !defined(__F16C__)
typedef _Float16 vf16 __attribute__((vector_size(SEGMENT * sizeof(_Float16))));
#endif

/* SEGMENT float16s widened: one vcvtph2ps where the target has F16C. */
#ifdef HAVE_F16
static inline __attribute__((always_inline)) vseg widen_f16(const unsigned char *p) {
    vseg v;
#if defined(__F16C__) && SEGMENT == 16
    __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&v, &w, sizeof v);
#elif defined(__F16C__) && SEGMENT == 8
    __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&v, &w, sizeof v);
#else
    vf16 h;
    memcpy(&h, p, sizeof h);
    v = __builtin_convertvector(h, vseg);
#endif
    return v;
}
#endif

/* SEGMENT elements of a pool row of `kind`, widened to floats (a bfloat16 is the top half of its
 * float: a widening and a shift). */
static inline __attribute__((always_inline)) vseg load_kv_seg(const unsigned char *p, const int kind) {
    vseg v;
    if (kind == KV_F32) {
        memcpy(&v, p, sizeof v);
        return v;
    }
#ifdef HAVE_F16
    if (kind == KV_F16) return widen_f16(p);
#endif
    vhalf h;
    memcpy(&h, p, sizeof h);
    vword u = __builtin_convertvector(h, vword) << 16;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* One vector whose lane i is the sum of the lanes of part[i]: log2(SEGMENT) rounds, each adding the
 * two halves of pairs of vectors. The rounds leave the sums in bit-reversed order, so callers file
 * position i's partial sums at part[BITREV[i]] and the result comes out in position order. */
#if SEGMENT == 16
static const int BITREV[SEGMENT] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

static inline vseg sum_lanes(const vseg part[SEGMENT]) {
    vseg a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = __builtin_shufflevector(part[2 * i], part[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                       22, 23) +
               __builtin_shufflevector(part[2 * i], part[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                                       28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26,
                                       27) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30,
                                       31);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28,
                                       29) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30,
                                       31);
    return __builtin_shufflevector(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}
#else
static const int BITREV[SEGMENT] = {0, 4, 2, 6, 1, 5, 3, 7};

static inline vseg sum_lanes(const vseg part[SEGMENT]) {
    vseg a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = __builtin_shufflevector(part[2 * i], part[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(part[2 * i], part[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(b[0], b[1], 1, 9, 3, 11, 5, 13, 7, 15);
}
#endif

/* Query heads [h0, h0 + span) of one KV head against the n (<= SEGMENT) keys of a segment, `stride`
 * elements apart: each key is loaded once for the span; scores[h * max_len + i]. `span` and `chunks`
 * (head_dim / SEGMENT) are constants where the call is inlined. */
static inline __attribute__((always_inline)) void score_span(const Work *w, const float *q,
                                                             const unsigned char *keys, int64_t stride, int64_t n,
                                                             float *scores, int64_t h0, const int64_t span,
                                                             const int64_t chunks, const Lines *next, int64_t part,
                                                             int64_t parts, const int kind) {
    int64_t dim = w->head_dim;
    vseg qh[SPAN_VECTORS], sums_of[SPAN_HEADS][SEGMENT];
    for (int64_t g = 0; g < span; g++)
        for (int64_t c = 0; c < chunks; c++) qh[g * chunks + c] = load_seg(q + (h0 + g) * dim + SEGMENT * c);
    for (int64_t i = 0; i < SEGMENT; i++) {
        prefetch_part(next, part * SEGMENT + i, parts * SEGMENT);
        vseg acc[SPAN_HEADS];
        for (int64_t g = 0; g < span; g++) acc[g] = (vseg){0};
        if (i < n) {
            vseg k[SPAN_VECTORS];
            for (int64_t c = 0; c < chunks; c++)
                k[c] = load_kv_seg(keys + (i * stride + SEGMENT * c) * kind_size(kind), kind);
            for (int64_t g = 0; g < span; g++)
                for (int64_t c = 0; c < chunks; c++) acc[g] += qh[g * chunks + c] * k[c];
        }
        for (int64_t g = 0; g < span; g++) sums_of[g][BITREV[i]] = acc[g];
    }
    for (int64_t g = 0; g < span; g++) {
        vseg sums = sum_lanes(sums_of[g]) * w->scale;
        float *row = scores + (h0 + g) * w->max_len;
        if (n == SEGMENT) store_seg(row, sums);
        else memcpy(row, &sums, sizeof(float) * n);
    }
}

/* out[h] += sum over i < n of probs[h * max_len + i] * value i, for the query heads [h0, h0 + span)
 * of one KV head: each value is loaded once for the span. */
static inline __attribute__((always_inline)) void value_span(const Work *w, const float *probs,
                                                             const unsigned char *values, int64_t stride, int64_t n,
                                                             float *out, int64_t h0, const int64_t span,
                                                             const int64_t chunks, const int kind) {
    int64_t dim = w->head_dim;
    vseg acc[SPAN_VECTORS];
    for (int64_t g = 0; g < span; g++)
        for (int64_t c = 0; c < chunks; c++) acc[g * chunks + c] = load_seg(out + (h0 + g) * dim + SEGMENT * c);
    for (int64_t i = 0; i < n; i++) {
        vseg v[SPAN_VECTORS];
        for (int64_t c = 0; c < chunks; c++)
            v[c] = load_kv_seg(values + (i * stride + SEGMENT * c) * kind_size(kind), kind);
        for (int64_t g = 0; g < span; g++) {
            float p = probs[(h0 + g) * w->max_len + i];
            for (int64_t c = 0; c < chunks; c++) acc[g * chunks + c] += p * v[c];
        }
    }
    for (int64_t g = 0; g < span; g++)
        for (int64_t c = 0; c < chunks; c++) store_seg(out + (h0 + g) * dim + SEGMENT * c, acc[g * chunks + c]);
}


/* The heads of the span starting at query head h0: up to `most`, all of h0's KV head. */
static inline int64_t span_at(const Work *w, int64_t h0, int64_t most) {
    int64_t group = w->heads / w->kv_heads, left = group - h0 % group;
    return left < most ? left : most;
}

/* The most heads in a span whose query vectors fill at most SPAN_VECTORS registers. */
static inline int64_t most_heads(int64_t chunks) {
    int64_t most = SPAN_VECTORS / chunks;
    return most > SPAN_HEADS ? SPAN_HEADS : most;
}

/* Every span of query heads against a segment's keys; the lines of the segment `next` segments
 * on are asked for in as many parts as there are positions to score. */
static inline __attribute__((always_inline)) void score_segment(const Work *w, const float *q,
                                                                const unsigned char *keys, int64_t stride, int64_t n,
                                                                float *scores, const int64_t chunks, Cursor ahead,
                                                                const int kind) {
    Lines next = segment_lines(w, ahead);
    int64_t most = most_heads(chunks), group = w->heads / w->kv_heads;
    int64_t parts = w->kv_heads * ((group + most - 1) / most), part = 0;
    for (int64_t h0 = 0, span; h0 < w->heads; h0 += span, part++) {
        const unsigned char *k = keys + (h0 / group) * w->head_dim * kind_size(kind);
        switch (span = span_at(w, h0, most)) { /* constant spans: their vectors stay in registers */
        case 1: score_span(w, q, k, stride, n, scores, h0, 1, chunks, &next, part, parts, kind); break;
        case 2:
            if (2 * chunks <= SPAN_VECTORS)
                score_span(w, q, k, stride, n, scores, h0, 2, chunks, &next, part, parts, kind);
            break;
        case 3:
            if (3 * chunks <= SPAN_VECTORS)
                score_span(w, q, k, stride, n, scores, h0, 3, chunks, &next, part, parts, kind);
            break;
        default:
            if (4 * chunks <= SPAN_VECTORS)
                score_span(w, q, k, stride, n, scores, h0, 4, chunks, &next, part, parts, kind);
        }
    }
}

static inline __attribute__((always_inline)) void value_segment(const Work *w, const float *probs,
                                                                const unsigned char *values, int64_t stride,
                                                                int64_t n, float *out, const int64_t chunks,
                                                                const int kind) {
    int64_t most = most_heads(chunks), group = w->heads / w->kv_heads;
    for (int64_t h0 = 0, span; h0 < w->heads; h0 += span) {
        const unsigned char *v = values + (h0 / group) * w->head_dim * kind_size(kind);
        switch (span = span_at(w, h0, most)) {
        case 1: value_span(w, probs, v, stride, n, out, h0, 1, chunks, kind); break;
        case 2: if (2 * chunks <= SPAN_VECTORS) value_span(w, probs, v, stride, n, out, h0, 2, chunks, kind); break;
        case 3: if (3 * chunks <= SPAN_VECTORS) value_span(w, probs, v, stride, n, out, h0, 3, chunks, kind); break;
        default: if (4 * chunks <= SPAN_VECTORS) value_span(w, probs, v, stride, n, out, h0, 4, chunks, kind);
        }
    }
}

static inline __attribute__((always_inline)) void attend_segments(const Work *w, int64_t b, float *scores,
                                                                  const int64_t chunks, Cursor *ahead,
                                                                  const int kind) {
    int64_t heads = w->heads, dim = w->head_dim, len = w->lens[b], stride = w->kv_heads * dim;
    const int64_t *table = w->tables + b * w->table_stride;
    const float *q = w->q + b * w->q_stride;
    float *out = w->out + b * heads * dim;
    int64_t start = start_of(w, b);
    for (int64_t t = start, end; t < len; t = end) {
        end = segment_end(w, t, len);
        score_segment(w, q, keys_at(w, table, t), stride, end - t, scores + t, chunks, *ahead, kind);
        cursor_next(w, ahead);
    }
    softmax_rows(scores + start, heads, len - start, w->max_len);
    memset(out, 0, sizeof(float) * heads * dim);
    for (int64_t t = start, end; t < len; t = end) {
        end = segment_end(w, t, len);
        value_segment(w, scores + t, values_of(w, keys_at(w, table, t)), stride, end - t, out, chunks, kind);
    }
}
#endif

static inline __attribute__((always_inline)) void attend_sequence_of(const Work *w, int64_t b, float *scores,
                                                                     Cursor *ahead, const int kind) {
#ifdef HAVE_SEGMENTS
    switch (w->head_dim) { /* constant chunk counts: a span's vectors stay in registers */
    case 64: attend_segments(w, b, scores, 64 / SEGMENT, ahead, kind); return;
    case 128: attend_segments(w, b, scores, 128 / SEGMENT, ahead, kind); return;
    default:
        if (w->head_dim % SEGMENT == 0 && w->head_dim / SEGMENT <= SPAN_VECTORS) {
            attend_segments(w, b, scores, w->head_dim / SEGMENT, ahead, kind);
            return;
        }
    }
#endif
    attend_positions(w, b, scores, ahead, kind);
}

/* Each kind of pool its own compiled loops. */
static void attend_sequence(const Work *w, int64_t b, float *scores, Cursor *ahead) {
    switch (w->kind) {
    case KV_BF16: attend_sequence_of(w, b, scores, ahead, KV_BF16); return;
#ifdef HAVE_F16
    case KV_F16: attend_sequence_of(w, b, scores, ahead, KV_F16); return;
#endif
    default: attend_sequence_of(w, b, scores, ahead, KV_F32);
    }
}

static void *run(void *arg) {
    Work *w = (Work *)arg;
    float *scores = malloc(sizeof(float) * w->heads * (w->max_len > 0 ? w->max_len : 1));
    if (!scores) {
        w->status = -1;
        return NULL;
    }
    Cursor ahead = {w->first, w->first < w->last ? start_of(w, w->first) : 0};
    for (int i = 0; i < AHEAD; i++) {
        Lines lines = segment_lines(w, ahead);
        prefetch_part(&lines, 0, 1);
        cursor_next(w, &ahead);
    }
    for (int64_t b = w->first; b < w->last; b++) attend_sequence(w, b, scores, &ahead);
    free(scores);
    w->status = 0;
    return NULL;
}

/* Returns 0, or -1 when memory or a thread could not be had (nothing is then valid in out). */
static int attend_from(const void *pool, const float *q, int64_t q_stride, float *out, const int64_t *tables,
                       int64_t table_stride, const int64_t *lens, int64_t batch, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, int64_t block_size, int64_t num_layers, int64_t layer, float scale,
                       int64_t max_len, int64_t threads, const int64_t *starts, int kind) {
    if (kv_heads < 1 || heads % kv_heads != 0) return -1;
    int64_t layer_size = 2 * block_size * kv_heads * head_dim;
    if (threads < 1) threads = 1;
    if (threads > batch) threads = batch > 0 ? batch : 1;
    Work base = {(const unsigned char *)pool, q, q_stride, out, tables, lens, table_stride, heads, kv_heads, head_dim,
                 block_size, num_layers * layer_size, layer * layer_size, block_size * kv_heads * head_dim,
                 max_len, scale, 0, 0, starts, 0, kind};
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

/* Each of `rows` tokens' keys and values (kv_heads * head_dim floats each, the tokens k_stride and
 * v_stride floats apart) stored into `layer` of the pool at its flat slot (block * block_size +
 * offset), as elements of `kind`. The caller checks every slot first. */
static inline __attribute__((always_inline)) void store_row(unsigned char *dst, const float *src, int64_t n,
                                                            const int kind) {
    if (kind == KV_F32) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    uint16_t *h = (uint16_t *)dst;
#ifdef HAVE_F16
    if (kind == KV_F16) {
        for (int64_t i = 0; i < n; i++) h[i] = float_to_f16(src[i]);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) h[i] = float_to_bf16(src[i]);
}

static inline __attribute__((always_inline)) void write_kv(void *pool, const float *k, int64_t k_stride,
                                                           const float *v, int64_t v_stride, const int64_t *slots,
                                                           int64_t rows, int64_t kv_heads, int64_t head_dim,
                                                           int64_t block_size, int64_t num_layers, int64_t layer,
                                                           const int kind) {
    int64_t row = kv_heads * head_dim, layer_size = 2 * block_size * row, size = kind_size(kind);
    for (int64_t t = 0; t < rows; t++) {
        int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
        unsigned char *keys =
            (unsigned char *)pool + (block * num_layers * layer_size + layer * layer_size + offset * row) * size;
        store_row(keys, k + t * k_stride, row, kind);
        store_row(keys + block_size * row * size, v + t * v_stride, row, kind);
    }
}

/* The entry points, one set per kind of pool: attend from each sequence's first position `starts`
 * (a window: t from starts[b] to lens[b]), attend every sequence from position 0 (the fused
 * decode step calls this one), and store a layer's new keys and values. */
#define ENTRY_POINTS(SUFFIX, KIND)                                                                                   \
    int pdserve_paged_attend_from##SUFFIX(const void *pool, const float *q, int64_t q_stride, float *out,           \
                                          const int64_t *tables, int64_t table_stride, const int64_t *lens,         \
                                          int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,         \
                                          int64_t block_size, int64_t num_layers, int64_t layer, float scale,       \
                                          int64_t max_len, int64_t threads, const int64_t *starts) {                \
        return attend_from(pool, q, q_stride, out, tables, table_stride, lens, batch, heads, kv_heads, head_dim,    \
                           block_size, num_layers, layer, scale, max_len, threads, starts, KIND);                   \
    }                                                                                                               \
    int pdserve_paged_decode##SUFFIX(const void *pool, const float *q, int64_t q_stride, float *out,                \
                                     const int64_t *tables, int64_t table_stride, const int64_t *lens, int64_t batch, \
                                     int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,          \
                                     int64_t num_layers, int64_t layer, float scale, int64_t max_len,                \
                                     int64_t threads) {                                                              \
        return attend_from(pool, q, q_stride, out, tables, table_stride, lens, batch, heads, kv_heads, head_dim,    \
                           block_size, num_layers, layer, scale, max_len, threads, NULL, KIND);                     \
    }                                                                                                               \
    void pdserve_write_kv##SUFFIX(void *pool, const float *k, int64_t k_stride, const float *v, int64_t v_stride,   \
                                  const int64_t *slots, int64_t rows, int64_t kv_heads, int64_t head_dim,           \
                                  int64_t block_size, int64_t num_layers, int64_t layer) {                          \
        write_kv(pool, k, k_stride, v, v_stride, slots, rows, kv_heads, head_dim, block_size, num_layers, layer,    \
                 KIND);                                                                                              \
    }

ENTRY_POINTS(, KV_F32)
ENTRY_POINTS(_bf16, KV_BF16)
#ifdef HAVE_F16
ENTRY_POINTS(_f16, KV_F16)
#endif

/* The kinds of pool this build serves: bit 0 float32, bit 1 bfloat16, bit 2 float16. */
int pdserve_paged_kv_kinds(void) {
#ifdef HAVE_F16
    return 1 | 2 | 4;
#else
    return 1 | 2;
#endif
}
