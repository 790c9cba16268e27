/* A decode step through every decoder layer in one call (float32): the same kernels
 * the modules call one at a time (the norms, SwiGLU and rotary positions of layer_kernels.c, the
 * panels of row_panels.c, the K/V copy and attention of paged_decode.c), passed
 * in as function pointers and run in the modules' order, on the modules' weights:
 *
 *   h = norm(x); qkv = h @ Wqkv (+ b); rope(q, k); K/V -> pool; a = attend(q); x = x + a @ Wo (+ b)
 *   h = norm(x); gu = h @ Wgate_up; g = silu(gate) * up; x = x + g @ Wdown
 *
 * so the result equals the modules' bit for bit; what it saves is the Python between the kernels
 * (about ten module and kernel calls a layer). x [rows, hidden] is updated in place; `scratch`
 * holds the intermediates of one layer (see scratch_floats). Loaded by decode_layers.py; called by
 * pdserve/cpu/fused_decode.py, which checks every shape first.
 */
#include <stddef.h>
#include <stdint.h>

typedef void (*RmsNorm)(const float *, int64_t, const float *, float *, int64_t, int64_t, float);
typedef void (*SiluMul)(float *, int64_t, int64_t, int64_t);
typedef void (*Rope)(float *, int64_t, int64_t, int64_t, const float *, const float *, int64_t);
typedef void (*Gemm)(const float *, int64_t, int64_t, const float *, int64_t, int64_t, float *, int64_t);
typedef void (*WriteKV)(float *, const float *, int64_t, const float *, int64_t, const int64_t *, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t);
typedef int (*Attend)(const float *, const float *, int64_t, float *, const int64_t *, int64_t, const int64_t *,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t, int64_t);

typedef struct {
    RmsNorm rms_norm;
    SiluMul silu_mul;
    Rope rope;
    Gemm gemm;
    WriteKV write_kv;
    Attend attend;
} Kernels;

typedef struct { /* one layer's weights: norms [hidden], projections in panels, biases or NULL */
    const float *input_norm, *post_norm, *qkv, *qkv_bias, *o, *o_bias, *gate_up, *down;
} Layer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter, num_layers, block_size;
    float eps, scale;
} Shape;

typedef struct { /* one pass */
    float *pool;
    const int64_t *slots, *tables, *lens;
    const float *cos, *sin;
    int64_t table_stride, max_len, attend_threads, threads; /* threads: the most a product runs on */
} Pass;

typedef struct {
    const Kernels *k;
    const Shape *s;
    const Pass *p;
    int64_t rows;
} Step;

static void project(const Step *st, const float *x, int64_t x_stride, const float *panels, const float *bias,
                    int64_t in, int64_t out, float *y) {
    st->k->gemm(x, x_stride, st->rows, panels, in, out, y, st->p->threads); /* it decides how many */
    if (bias)
        for (int64_t t = 0; t < st->rows; t++)
            for (int64_t c = 0; c < out; c++) y[t * out + c] += bias[c];
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = y[i] + x[i]; /* the modules' y.add_(x) */
}

/* Floats of scratch a step of `rows` rows needs. */
int64_t pdserve_decode_scratch_floats(const Shape *s, int64_t rows) {
    int64_t qkv = (s->heads + 2 * s->kv_heads) * s->head_dim;
    return rows * (s->hidden + qkv + s->heads * s->head_dim + s->hidden + 2 * s->inter);
}

static int layer_step(const Step *st, const Layer *w, int64_t layer, float *x, float *scratch) {
    const Shape *s = st->s;
    const Pass *p = st->p;
    int64_t rows = st->rows, hd = s->head_dim, q_size = s->heads * hd, kv_size = s->kv_heads * hd;
    int64_t qkv_size = q_size + 2 * kv_size;
    float *h = scratch, *qkv = h + rows * s->hidden, *att = qkv + rows * qkv_size;
    float *y = att + rows * q_size, *gate_up = y + rows * s->hidden;

    st->k->rms_norm(x, s->hidden, w->input_norm, h, rows, s->hidden, s->eps);
    project(st, h, s->hidden, w->qkv, w->qkv_bias, s->hidden, qkv_size, qkv);
    st->k->rope(qkv, qkv_size, s->heads + s->kv_heads, hd, p->cos, p->sin, rows);
    st->k->write_kv(p->pool, qkv + q_size, qkv_size, qkv + q_size + kv_size, qkv_size, p->slots, rows, s->kv_heads,
                    hd, s->block_size, s->num_layers, layer);
    if (st->k->attend(p->pool, qkv, qkv_size, att, p->tables, p->table_stride, p->lens, rows, s->heads,
                      s->kv_heads, hd, s->block_size, s->num_layers, layer, s->scale, p->max_len,
                      p->attend_threads) != 0)
        return -1;
    project(st, att, q_size, w->o, w->o_bias, q_size, s->hidden, y);
    add_into(x, y, rows * s->hidden);

    st->k->rms_norm(x, s->hidden, w->post_norm, h, rows, s->hidden, s->eps);
    project(st, h, s->hidden, w->gate_up, NULL, s->hidden, 2 * s->inter, gate_up);
    st->k->silu_mul(gate_up, 2 * s->inter, rows, s->inter);
    project(st, gate_up, 2 * s->inter, w->down, NULL, s->inter, s->hidden, y);
    add_into(x, y, rows * s->hidden);
    return 0;
}

/* Returns 0, or -1 when the attention kernel could not allocate (x is then not valid). */
int pdserve_decode_layers(const Kernels *k, const Layer *layers, const Shape *s, const Pass *p, float *x,
                          int64_t rows, float *scratch) {
    Step st = {k, s, p, rows};
    for (int64_t layer = 0; layer < s->num_layers; layer++)
        if (layer_step(&st, &layers[layer], layer, x, scratch) != 0) return -1;
    return 0;
}
