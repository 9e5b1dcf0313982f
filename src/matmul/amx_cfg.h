/* amx_cfg.h: the tile configuration the AMX kernels load (amx_amx.c, the
 * BF16 route; int8_amxi8.c, the int8 K panel): palette 1, all eight tiles
 * 16 rows of 64 bytes. Data only: the files that load it are compiled
 * with the tile flags. */
#ifndef DHSA_MATMUL_AMX_CFG_H
#define DHSA_MATMUL_AMX_CFG_H

#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} dhsa__tile_cfg;

static inline void dhsa__tile_cfg_16x64(dhsa__tile_cfg *c) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int i = 0; i < 8; i++) {
        c->rows[i] = 16;
        c->colsb[i] = 64;
    }
}

#endif
