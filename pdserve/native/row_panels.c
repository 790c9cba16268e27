/* The projections of a decode step (one to a few hundred rows) from the weight in panels (float32):
 *
 *   y[t, c] = sum_i x[t, i] * W[i, c]    for t < rows, c < out
 *
 * with W [in, out] packed once at load as panels[p][i][j] = W[i, PANEL p + j] (PANEL columns a
 * panel, the last one zero-padded). A panel is read front to back, one row of PANEL columns after
 * another, so the whole weight is one sequential stream: a row's product is bound by how fast memory
 * delivers the weight, and every row of a tile (up to ROW_TILE rows) reuses each vector while it is
 * in registers; the next tiles of rows read the same panel again, from the cache, so many rows are
 * bound by the FMA units instead. Each y[t, c] is one sum in input order (i = 0, 1, ..., in - 1),
 * whatever the rows beside t.
 *
 * A weight is read from memory once a product (a decode step's weights are far larger than the
 * caches), so each tile also prefetches its share of the next panel into L2 (block_tiles): the
 * first row tile of a panel then finds it there instead of waiting for memory while the FMA units
 * idle (one thread, SmolLM2's projections at 64 rows: 146 GFLOP/s without, 212 with; at 4 rows,
 * one tile a panel, 24 and 31; docs/BENCHMARKS.md). It changes no sum.
 *
 * The tile fits the register file of the instruction set this file is compiled for (-march):
 *
 *   AVX-512 (32 registers of 16 floats): PANEL 64 = 4 vectors, 6 rows: 24 sums + 4 weights
 *   otherwise (AVX2: 16 registers of 8):  PANEL 16 = 2 vectors, 6 rows: 12 sums + 2 weights + x
 *
 * (a 64-column tile of 24 sums on AVX2 spills to the stack, and ran at a tenth of the dense
 * product's rate on a znver1 EPYC). pdserve_panels_width() tells the packer which.
 *
 * The rows go in blocks whose x (block rows x in floats) fills at most half of the L2 cache this CPU
 * reports, so every panel of a block reads x from L2 (256 rows of a 576-wide x are 590 KB, more
 * than a znver3 core's 512 KB L2): each block reads the weight once more, from memory or L3.
 *
 * x's rows may be strided (`x_stride` floats from one row's start to the next); y is [rows, out]
 * contiguous. The (row block, panel, row tile) grid is split over up to `limit` POSIX threads where
 * the product is worth it (pdserve_panels_threads: the one place that decides, for every caller).
 * Loaded by row_panels.py, which packs the panels and checks every shape and stride first;
 * tests/cpu/test_panel_weights.py compares it with the dense product.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#ifdef __AVX512F__
#define VEC 16  /* floats a vector register */
#define VECS 4  /* vectors a panel row */
#else
#define VEC 8
#define VECS 2
#endif
#define PANEL (VEC * VECS) /* columns a panel */
#define ROW_TILE 6         /* rows a pass */
#define L2_BYTES 524288    /* where the CPU does not report its L2 */
/* a product is split over threads where it takes long enough for a thread's start to pay: */
#define THREADED_FLOATS (1 << 20) /* a weight of 4 MB, read from memory (one or a few rows) */
#define THREADED_MACS (8 << 20)   /* or this many multiply-adds (many rows) */

typedef float vec __attribute__((vector_size(VEC * sizeof(float))));

static inline vec load(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Where a tile prefetches the next panel's rows into L2 while it multiplies (see block_tiles). */
typedef struct {
    const float *next; /* the first of `count` rows (PANEL floats each) to prefetch; NULL: none */
    int64_t count, every; /* one row every `every` iterations of the tile's input loop */
} Prefetch;

static inline void prefetch_row(const float *row) {
    for (int line = 0; line < PANEL * (int)sizeof(float) / 64; line++)
        __builtin_prefetch((const char *)row + 64 * line, 0, 2); /* prefetcht1: into L2 */
}

/* The first `cols` columns of one panel's product for ROWS rows, into y (row stride `out`). */
#define PANEL_ROWS(ROWS)                                                                          \
    static void panel_##ROWS(const float *x, int64_t x_stride, const float *panel, int64_t in,   \
                             float *y, int64_t out, int64_t cols, Prefetch pf) {                 \
        vec acc[ROWS][VECS] = {{{0}}};                                                            \
        int64_t wait = pf.every;                                                                  \
        for (int64_t i = 0; i < in; i++, panel += PANEL) {                                        \
            if (pf.count > 0 && --wait == 0) {                                                    \
                prefetch_row(pf.next);                                                            \
                pf.next += PANEL, pf.count--, wait = pf.every;                                    \
            }                                                                                     \
            vec w[VECS];                                                                          \
            for (int v = 0; v < VECS; v++) w[v] = load(panel + v * VEC);                          \
            for (int r = 0; r < ROWS; r++) {                                                      \
                float a = x[r * x_stride + i];                                                    \
                for (int v = 0; v < VECS; v++) acc[r][v] += a * w[v];                             \
            }                                                                                     \
        }                                                                                         \
        for (int r = 0; r < ROWS; r++) {                                                          \
            if (cols == PANEL) { /* a whole panel: no copy through the stack */                   \
                memcpy(y + r * out, acc[r], sizeof acc[r]);                                       \
                continue;                                                                         \
            }                                                                                     \
            float tile[PANEL];                                                                    \
            memcpy(tile, acc[r], sizeof tile);                                                    \
            memcpy(y + r * out, tile, (size_t)cols * sizeof(float));                              \
        }                                                                                         \
    }

PANEL_ROWS(1)
PANEL_ROWS(2)
PANEL_ROWS(3)
PANEL_ROWS(4)
PANEL_ROWS(5)
PANEL_ROWS(6)

typedef void (*PanelRows)(const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t, Prefetch);
static const PanelRows BY_ROWS[ROW_TILE + 1] = {0, panel_1, panel_2, panel_3, panel_4, panel_5, panel_6};

/* The columns of a panel as this build lays them out (the packer asks). */
int64_t pdserve_panels_width(void) { return PANEL; }

static pthread_once_t l2_read = PTHREAD_ONCE_INIT;
static int64_t l2_bytes = L2_BYTES; /* written once, by read_l2 */

static void read_l2(void) { /* sysconf may ask the CPU (cpuid: a VM exit in a VM), so once */
    long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (bytes > 0) l2_bytes = bytes;
}

/* Rows a block: whole row tiles whose x fills at most half of L2 (one tile at the least). */
static int64_t block_rows(int64_t in) {
    pthread_once(&l2_read, read_l2);
    int64_t tiles = l2_bytes / 2 / (in * (int64_t)sizeof(float)) / ROW_TILE;
    return (tiles < 1 ? 1 : tiles) * ROW_TILE;
}

typedef struct {
    const float *x, *panels;
    float *y;
    int64_t x_stride, rows, in, out, block, first, last; /* tiles [first, last) of the grid */
} Work;

/* The tiles [first, last) of the block of rows from r0 (`tiles` row tiles a panel, panel-major).
 * Row tile k of panel p prefetches the k-th of `tiles` slices of the next panel's rows, spread over
 * its input loop, so that the next panel is in L2 when its first row tile reads it. */
static void block_tiles(const Work *w, int64_t r0, int64_t tiles, int64_t first, int64_t last) {
    int64_t panels = (w->out + PANEL - 1) / PANEL, span = (w->in + tiles - 1) / tiles, every = w->in / span;
    for (int64_t t = first, p = first / tiles, k = first % tiles; t < last; t++) {
        int64_t r = r0 + k * ROW_TILE, c0 = p * PANEL, start = k * span;
        const float *panel = w->panels + p * w->in * PANEL;
        int64_t cols = w->out - c0 < PANEL ? w->out - c0 : PANEL;
        int64_t n = w->rows - r < ROW_TILE ? w->rows - r : ROW_TILE;
        Prefetch ahead = {NULL, 0, 1};
        if (p + 1 < panels && start < w->in)
            ahead = (Prefetch){panel + (w->in + start) * PANEL, w->in - start < span ? w->in - start : span, every};
        BY_ROWS[n](w->x + r * w->x_stride, w->x_stride, panel, w->in, w->y + r * w->out + c0, w->out, cols, ahead);
        if (++k == tiles) k = 0, p++;
    }
}

/* The grid: row blocks, in each the (panel, row tile) tiles panel-major, so a thread's run of tiles
 * reads each of its panels from memory once a block and its other row tiles find it in the cache. */
static void *run(void *arg) {
    const Work *w = arg;
    int64_t panels = (w->out + PANEL - 1) / PANEL;
    for (int64_t r0 = 0, start = 0; r0 < w->rows && start < w->last; r0 += w->block) {
        int64_t rows = w->rows - r0 < w->block ? w->rows - r0 : w->block;
        int64_t tiles = (rows + ROW_TILE - 1) / ROW_TILE, end = start + panels * tiles;
        int64_t first = w->first > start ? w->first : start, last = w->last < end ? w->last : end;
        if (first < last) block_tiles(w, r0, tiles, first - start, last - start);
        start = end;
    }
    return NULL;
}

static int64_t grid_tiles(int64_t rows, int64_t out) {
    return (out + PANEL - 1) / PANEL * ((rows + ROW_TILE - 1) / ROW_TILE);
}

/* The threads a product of `rows` rows by an [in, out] weight runs on, of up to `limit`: one unless
 * its weight or its multiply-adds reach the thresholds above, and never more than its tiles. */
int64_t pdserve_panels_threads(int64_t rows, int64_t in, int64_t out, int64_t limit) {
    int64_t tiles = grid_tiles(rows, out);
    if (in * out < THREADED_FLOATS && rows * in * out < THREADED_MACS) return 1;
    if (limit > tiles) limit = tiles;
    return limit < 1 ? 1 : limit;
}

void pdserve_panels_gemm(const float *x, int64_t x_stride, int64_t rows, const float *panels, int64_t in,
                         int64_t out, float *y, int64_t limit) {
    int64_t block = block_rows(in), count = 0, threads = pdserve_panels_threads(rows, in, out, limit);
    for (int64_t r0 = 0; r0 < rows; r0 += block) count += grid_tiles(rows - r0 < block ? rows - r0 : block, out);
    Work work[threads];
    pthread_t ids[threads];
    int started[threads];
    for (int64_t i = 0; i < threads; i++) {
        work[i] = (Work){x, panels, y, x_stride, rows, in, out, block, count * i / threads, count * (i + 1) / threads};
        started[i] = i > 0 && pthread_create(&ids[i], NULL, run, &work[i]) == 0;
    }
    for (int64_t i = 1; i < threads; i++)
        if (!started[i]) run(&work[i]); /* no thread: this one computes its share */
    run(&work[0]);
    for (int64_t i = 1; i < threads; i++)
        if (started[i]) pthread_join(ids[i], NULL);
}
