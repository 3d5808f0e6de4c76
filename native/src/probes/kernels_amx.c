/*
 * AMX-BF16 probe (compiled with -mamx-tile -mamx-bf16; run only where probes.c found AMX-TILE,
 * AMX-BF16 and the tile data state granted by Linux: Intel Sapphire Rapids and later). It is
 * the bf16 roof wherever the CPU backend's AMX build runs, since that build's matrix products
 * are TDPBF16PS.
 *
 * Method: the tiles of the backend's products (gemm_amx.inl), 2 x 2 blocking: C tiles 0-3 of
 * 16 x 16 f32, A tiles 4-5 of 16 rows x 16 bf16 pairs, B tiles 6-7 of 16 pair rows x 16
 * columns, and per iteration the four independent TDPBF16PS C[i][j] += A[i] B[j], no memory
 * access in the loop. Each instruction adds 16 pairs of products into each of the 256 f32
 * elements of its C tile: counted as 256 x 16 "lanes" of 4 FLOPs (2 multiplies, 2 additions)
 * per iteration and C tile, as the vdpbf16ps probe counts its lanes. Four accumulating tiles
 * cover the instruction's latency (one TDPBF16PS issues every 16 cycles per core and its result
 * is ready after about 50).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "probes/kernels.h"

typedef struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

static double dot_amx(uint64_t iterations, uint32_t a_pair, uint32_t b_pair) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.bytes_per_row[t] = 64;
        config.rows[t] = 16;
    }
    uint32_t a[16 * 16], b[16 * 16];
    for (int i = 0; i < 16 * 16; ++i) {
        a[i] = a_pair;
        b[i] = b_pair;
    }
    _tile_loadconfig(&config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    for (uint64_t i = 0; i < iterations; ++i) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float c[4][16 * 16];
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    _tile_release();
    double sum = 0;
    for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 16 * 16; ++i) sum += c[t][i];
    return sum;
}

const probe_compute* probe_dot_amx_bf16(void) {
    static const probe_compute probe = {
        "amx_bf16", dot_amx, 4 * 256 * 16, 4,
        "tdpbf16ps: 4 independent 16 x 16 f32 tiles (2 x 2 blocks of A and B tiles, 16 bf16 "
        "pairs per element) per thread, no memory access"};
    return &probe;
}
