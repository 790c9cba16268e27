/* The small ops of a decoder layer as one pass over each row (float32), for a CPU decode step
 * where torch would run four to six ops with a fresh buffer each:
 *
 *   rms_norm: out[t] = (x[t] * 1 / sqrt(mean(x[t]^2) + eps)) * weight
 *   silu_mul: in place, gate_up[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]
 *             (silu(g) = g / (1 + e^-g); the product is the gate half's view)
 *   rope:     the rotate-half form, in place: for each head of x[t] and each pair (i, i + D/2),
 *             (a, b) -> (a cos - b sin, b cos + a sin) at the token's angles cos[t, i], sin[t, i]
 *
 * Rows may be strided (`*_stride`: floats from one row's start to the next); elements within a row
 * are contiguous. Loaded by layer_kernels.py; pdserve/cpu/layer_kernels.py checks every shape and
 * stride first; tests/cpu/test_layer_kernels.py compares each with the torch reference.
 */
#include <math.h>
#include <stdint.h>

#define LANES 16

/* The sum of squares of n floats, in LANES partial sums (one vector's lanes). */
static float sum_squares(const float *x, int64_t n) {
    float part[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) part[j] += x[i + j] * x[i + j];
    float total = 0.0f;
    for (int j = 0; j < LANES; j++) total += part[j];
    for (; i < n; i++) total += x[i] * x[i];
    return total;
}

void pdserve_rms_norm(const float *restrict x, int64_t x_stride, const float *restrict weight,
                      float *restrict out, int64_t rows, int64_t dim, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        const float *row = x + t * x_stride;
        float *o = out + t * dim, scale = 1.0f / sqrtf(sum_squares(row, dim) / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) o[i] = (row[i] * scale) * weight[i];
    }
}

/* In place: each row's gate half becomes the product (its up half is left as it was). */
void pdserve_silu_mul(float *gate_up, int64_t stride, int64_t rows, int64_t inter) {
    for (int64_t t = 0; t < rows; t++) {
        float *gate = gate_up + t * stride;
        const float *up = gate + inter;
#pragma GCC ivdep
        for (int64_t i = 0; i < inter; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

void pdserve_rope(float *x, int64_t x_stride, int64_t heads, int64_t head_dim, const float *cos, const float *sin,
                  int64_t rows) {
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < rows; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *a = x + t * x_stride + h * head_dim, *b = a + half;
            for (int64_t i = 0; i < half; i++) {
                float first = a[i] * c[i] - b[i] * s[i], second = b[i] * c[i] + a[i] * s[i];
                a[i] = first;
                b[i] = second;
            }
        }
    }
}
