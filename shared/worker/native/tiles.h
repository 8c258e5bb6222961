/* The driver of the int8-activation kernels (w8a8.c, q4v.c), included by each after its own
 * register tile():
 *     tile(mat, xq, m0, M, b0, NB, out, ldo, accumulate)
 * multiplies M activation rows from m0 with NB blocks of LANES weight rows from b0. TILE_M and
 * TILE_B (the full tile) and TILES_FOR (the name of the function to define) come from the
 * including file. The weight blocks are split between the threads in panels of TILE_B; each
 * panel walks the rows TILE_M at a time, the rest by a smaller constant tile, so every call of
 * tile() has constant M and NB and keeps its accumulators in registers. */
#ifndef TILE_M
#error "tiles.h needs TILE_M, TILE_B, TILES_FOR and tile() from the including file"
#endif

static inline __attribute__((always_inline)) void column(const Mat *mat, const XQ *xq, int64_t rows,
                                                        int64_t b0, const int NB, float *out,
                                                        int64_t ldo, int accumulate) {
    int64_t m0 = 0;
    for (; m0 + TILE_M <= rows; m0 += TILE_M) tile(mat, xq, m0, TILE_M, b0, NB, out, ldo, accumulate);
    switch (rows - m0) {
    case 3: tile(mat, xq, m0, 3, b0, NB, out, ldo, accumulate); break;
    case 2: tile(mat, xq, m0, 2, b0, NB, out, ldo, accumulate); break;
    case 1: tile(mat, xq, m0, 1, b0, NB, out, ldo, accumulate); break;
    default: break;
    }
}

/* An orphaned omp for over the panels; ends at a barrier (the single). */
void TILES_FOR(const Mat *mat, const XQ *xq, int64_t rows, float *out, int64_t ldo, int acc) {
    const int64_t blocks = mat->n / LANES, panels = blocks / TILE_B;
    #pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < panels; i++) column(mat, xq, rows, i * TILE_B, TILE_B, out, ldo, acc);
    #pragma omp single
    for (int64_t b = panels * TILE_B; b < blocks; b++) column(mat, xq, rows, b, 1, out, ldo, acc);
}
