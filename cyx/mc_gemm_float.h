/* F32, F16 and BF16 weights against many x rows, on 512-bit registers (the VNNI level's
 * AVX-512F) or on AVX2's, for the float paths of mc_matmul: a prefill or an embedding batch on a model
 * kept in its float weights (an HF directory packed without --quantize, an F16 GGUF,
 * all-MiniLM's f32 safetensors), and the exact mode's products (mc_matmul_exact_chunk: a
 * tile's weight rows dequantized to f32 first).
 *
 * The row kernels (mc_dot_f32_avx2, mc_dot_f16_avx2, mc_dot_bf16_avx2 and their 4-row
 * twins) meet every x row with every weight row straight from memory: a weight vector per
 * FMA and an x vector per FMA, so they ran at ~20 GMAC/s at 512 x rows on a machine whose
 * two cores do ~176 GFMA/s.  Here a register tile of 6 x rows x 4 weight rows (AVX2, 16
 * registers: 3 x 2) takes 10 vector loads per 24 FMAs (AVX2: 5 per 6), over columns in
 * passes of MC_FG_KC whose weights (16 rows) are read from L1 / L2 while every x row of a
 * block of MC_FG_JB meets them; the tile's accumulators wait in scratch between passes.
 *
 * Arithmetic.  The row kernels keep two 8-lane accumulators per (x row, weight row), a0
 * over columns 16 m + l and a1 over 16 m + 8 + l, one fused multiply-add each per column,
 * then sum(a0 + a1) by mc_hsum256.  One 16-lane accumulator holds a0 in its low half and
 * a1 in its high half (AVX2: the pair itself), fed the same FMAs in the same column order,
 * so the sum is formed from the same values: results bit-identical to the row kernels (K a multiple of 16; other
 * widths stay on them). */
#ifndef MC_GEMM_FLOAT_H
#define MC_GEMM_FLOAT_H

#include "mc_dot_avx2_more.h"
#include "mc_gemm_zmm.h"

#if defined(MC_X86)

/* columns per pass (longer passes store and reload the accumulators less often; at 512 x
 * rows of a 2048 x 2048 weight, 2 threads: 256 columns 60 / 73 / 72 GMAC/s for F32 / F16 /
 * BF16, 512 65-68 / 79 / 83, 1024 68 / 85 / 88) */
#ifndef MC_FG_KC
#define MC_FG_KC 1024
#endif
/* x rows a block: 6 register tiles of 6 (4 x rows a tile: F32 71 -> 81 GMAC/s at 512 x rows,
 * F16 88 -> 95, BF16 90 -> 94) */
#define MC_FG_JB 36
/* weight rows per tile of the pool (each tile reads every x row once per block) */
#ifndef MC_FG_TR
#define MC_FG_TR 32
#endif
/* fewest x rows for the exact mode's dequantized tiles (fewer: each row dequantized and
 * dotted alone, or fused, mc_matmul_exact_chunk); float weights take this path from 1 row:
 * its 4 weight rows a step are 4 FMA chains where the row kernel has 1 (AVX2: 2) */
#define MC_FG_MIN_ROWS 4

/* whether mc_matmul takes the float GEMM for weights of type t, K columns at `simd` */
static int mc_fg_takes(int t, int K, int simd) {
    return MC_IS_AVX2(simd) && mc_is_float(t) && K % 16 == 0;
}

/* the 16 weights of row w from column i, as floats (exact conversions) */
MC_ZMM static inline __attribute__((always_inline)) __m512 mc_fg_load(const uint8_t *w, int i, const int t) {
    if (t == MC_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)i)));
    if (t == MC_BF16) {
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    return _mm512_loadu_ps((const float *)w + i);
}

/* the row kernels' final sum of one accumulator: mc_hsum256(a0 + a1) */
MC_ZMM static inline __attribute__((always_inline)) float mc_fg_sum(__m512 acc) {
    const __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc), 1));
    return mc_hsum256(_mm256_add_ps(_mm512_castps512_ps256(acc), hi));
}

/* Weight rows a float tile prefetches ahead of the rows it reads (the same columns), while
 * they come from memory (mc_fg_tile's first block of x rows; later blocks find them in L2).
 * The hardware prefetchers alone left a decode step's weights at ~10 GB/s a core on the
 * AVX-512 Xeon VM: SmolLM2 as F16, one pass over its weights at 1 x row, 2 threads, 17.4
 * -> 26.8 GB/s with 4 rows ahead (8 rows the same), at 8 x rows 10.7 -> 15.6 GB/s. */
#ifndef MC_FG_PF
#define MC_FG_PF 4
#endif

/* x rows x[0 .. na) (na <= 6) against weight rows w[0 .. nw) (nw <= 4) over columns
 * [k0, k1): the accumulators start at zero (first) or from keep (16 floats each, a * 4 + c),
 * and end in keep, or (last) summed into y[a * ldy + c]; pf (bytes; 0: none): each weight
 * row's line that far on is prefetched as its columns are read */
MC_ZMM static inline __attribute__((always_inline)) void
mc_fg_body(const float *const x[6], const uint8_t *const w[4], int k0, int k1, float *keep,
           int first, int last, float *y, size_t ldy, size_t pf, const int na, const int nw,
           const int t) {
    __m512 acc[24];
    for (int a = 0; a < na; a++)
        for (int c = 0; c < nw; c++)
            acc[4 * a + c] = first ? _mm512_setzero_ps() : _mm512_load_ps(keep + 16 * (4 * a + c));
    for (int i = k0; i < k1; i += 16) {
        __m512 wv[4];
        if (pf != 0 && (t == MC_F32 || (i & 31) == 0)) /* one prefetch a 64-byte line */
            for (int c = 0; c < nw; c++)
                _mm_prefetch((const char *)w[c] + pf + (t == MC_F32 ? 4 : 2) * (size_t)i, _MM_HINT_T0);
        for (int c = 0; c < nw; c++) wv[c] = mc_fg_load(w[c], i, t);
        for (int a = 0; a < na; a++) {
            const __m512 xv = _mm512_loadu_ps(x[a] + i);
            for (int c = 0; c < nw; c++) acc[4 * a + c] = _mm512_fmadd_ps(wv[c], xv, acc[4 * a + c]);
        }
    }
    for (int a = 0; a < na; a++)
        for (int c = 0; c < nw; c++) {
            if (last)
                y[(size_t)a * ldy + c] = mc_fg_sum(acc[4 * a + c]);
            else
                _mm512_store_ps(keep + 16 * (4 * a + c), acc[4 * a + c]);
        }
}

/* mc_fg_body with na and nw as constants where nw is 4 (every weight row but a tile's last
 * few), the rest with them as variables */
#define MC_FG_FN(name, t_)                                                                         \
    MC_ZMM static void name(const float *const x[6], const uint8_t *const w[4], int k0, int k1,   \
                            float *keep, int first, int last, float *y, size_t ldy, size_t pf,     \
                            int na, int nw) {                                                      \
        if (nw == 4) {                                                                             \
            switch (na) {                                                                          \
            case 6: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 6, 4, t_); return;    \
            case 5: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 5, 4, t_); return;    \
            case 4: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 4, 4, t_); return;    \
            case 3: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 3, 4, t_); return;    \
            case 2: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 2, 4, t_); return;    \
            default: mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 1, 4, t_); return;   \
            }                                                                                      \
        }                                                                                          \
        mc_fg_body(x, w, k0, k1, keep, first, last, y, ldy, pf, na, nw, t_);                       \
    }

MC_FG_FN(mc_fg_f32, MC_F32)
MC_FG_FN(mc_fg_f16, MC_F16)
MC_FG_FN(mc_fg_bf16, MC_BF16)

/* AVX2: the 8 weights of row w from column i, as floats */
MC_AVX2 static inline __attribute__((always_inline)) __m256 mc_fg_load8(const uint8_t *w, int i, const int t) {
    if (t == MC_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * (size_t)i)));
    if (t == MC_BF16) return mc_bf16x8(w + 2 * (size_t)i);
    return _mm256_loadu_ps((const float *)w + i);
}

/* mc_fg_body on AVX2 (x rows na <= 3, weight rows nw <= 2): each pair's a0 and a1 kept at
 * keep + 16 (2 a + c), a0 first */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_fg8_body(const float *const x[6], const uint8_t *const w[4], int k0, int k1, float *keep,
            int first, int last, float *y, size_t ldy, size_t pf, const int na, const int nw,
            const int t) {
    __m256 a0[6], a1[6];
    for (int a = 0; a < na; a++)
        for (int c = 0; c < nw; c++) {
            const int p = 2 * a + c;
            a0[p] = first ? _mm256_setzero_ps() : _mm256_load_ps(keep + 16 * p);
            a1[p] = first ? _mm256_setzero_ps() : _mm256_load_ps(keep + 16 * p + 8);
        }
    for (int i = k0; i < k1; i += 16) {
        __m256 wv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}; /* (GCC 12 warns otherwise) */
        if (pf != 0 && (t == MC_F32 || (i & 31) == 0)) /* as mc_fg_body */
            for (int c = 0; c < nw; c++)
                _mm_prefetch((const char *)w[c] + pf + (t == MC_F32 ? 4 : 2) * (size_t)i, _MM_HINT_T0);
        for (int c = 0; c < nw; c++) wv[c] = mc_fg_load8(w[c], i, t);
        for (int a = 0; a < na; a++) {
            const __m256 xv = _mm256_loadu_ps(x[a] + i);
            for (int c = 0; c < nw; c++) a0[2 * a + c] = _mm256_fmadd_ps(wv[c], xv, a0[2 * a + c]);
        }
        for (int c = 0; c < nw; c++) wv[c] = mc_fg_load8(w[c], i + 8, t);
        for (int a = 0; a < na; a++) {
            const __m256 xv = _mm256_loadu_ps(x[a] + i + 8);
            for (int c = 0; c < nw; c++) a1[2 * a + c] = _mm256_fmadd_ps(wv[c], xv, a1[2 * a + c]);
        }
    }
    for (int a = 0; a < na; a++)
        for (int c = 0; c < nw; c++) {
            const int p = 2 * a + c;
            if (last) {
                y[(size_t)a * ldy + c] = mc_hsum256(_mm256_add_ps(a0[p], a1[p]));
            } else {
                _mm256_store_ps(keep + 16 * p, a0[p]);
                _mm256_store_ps(keep + 16 * p + 8, a1[p]);
            }
        }
}

#define MC_FG8_FN(name, t_)                                                                        \
    MC_AVX2 static void name(const float *const x[6], const uint8_t *const w[4], int k0, int k1,  \
                             float *keep, int first, int last, float *y, size_t ldy, size_t pf, \
                             int na, int nw) {                                                      \
        if (nw == 2) {                                                                             \
            switch (na) {                                                                          \
            case 3: mc_fg8_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 3, 2, t_); return;       \
            case 2: mc_fg8_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 2, 2, t_); return;       \
            default: mc_fg8_body(x, w, k0, k1, keep, first, last, y, ldy, pf, 1, 2, t_); return;      \
            }                                                                                      \
        }                                                                                          \
        mc_fg8_body(x, w, k0, k1, keep, first, last, y, ldy, pf, na, nw, t_);                          \
    }

MC_FG8_FN(mc_fg8_f32, MC_F32)
MC_FG8_FN(mc_fg8_f16, MC_F16)
MC_FG8_FN(mc_fg8_bf16, MC_BF16)

/* weight rows [r0, r1) (type t: F32, F16, BF16; row r0 at W0, rows row_stride bytes apart)
 * against x rows (n, K) into columns [r0, r1) of y (n, ldy) at `simd` (mc_fg_takes): blocks of
 * MC_FG_JB x rows, each against sub-tiles of 16 weight rows, pass by pass, in register tiles of ga x
 * rows x gw weight rows; pf_rows: the prefetch distance in weight rows (MC_FG_PF for weights
 * in memory, 0 for ones already in cache).  Returns -2 when out of memory (scratch), else 0. */
static int mc_fg_tile(int t, const uint8_t *W0, int64_t row_stride, int r0, int r1, int K,
                      const float *x, int n, float *y, size_t ldy, int simd, int pf_rows) {
    typedef void (*fg_fn)(const float *const *, const uint8_t *const *, int, int, float *, int,
                          int, float *, size_t, size_t, int, int);
    const int zmm = simd == MC_SIMD_VNNI, ga = zmm ? 6 : 3, gw = zmm ? 4 : 2;
    const fg_fn fn = zmm ? (t == MC_F16 ? mc_fg_f16 : t == MC_BF16 ? mc_fg_bf16 : mc_fg_f32)
                         : (t == MC_F16 ? mc_fg8_f16 : t == MC_BF16 ? mc_fg8_bf16 : mc_fg8_f32);
    const int tiles_j = (MC_FG_JB + ga - 1) / ga, tiles_r = 16 / gw; /* register tiles of a block */
    const size_t per = (size_t)16 * ga * gw; /* kept floats a register tile */
    float *keep = NULL;
    if (K > MC_FG_KC) { /* `per` floats (64-byte aligned) for each register tile of a block */
        char *buf = (char *)mc_scratch(2, sizeof(float) * per * (size_t)(tiles_j * tiles_r) + 64);
        if (buf == NULL) return -2;
        keep = (float *)(buf + ((64 - ((uintptr_t)buf & 63)) & 63));
    }
    for (int j0 = 0; j0 < n; j0 += MC_FG_JB) {
        const int j1 = mc_imin(n, j0 + MC_FG_JB);
        /* the first block reads the tile's weights from memory: prefetch pf_rows rows on */
        const size_t pf = j0 == 0 ? (size_t)row_stride * (size_t)pf_rows : 0;
        for (int rs = r0; rs < r1; rs += 16) {
            const int re = mc_imin(r1, rs + 16);
            for (int k0 = 0; k0 < K; k0 += MC_FG_KC) {
                const int k1 = mc_imin(K, k0 + MC_FG_KC);
                for (int j = j0; j < j1; j += ga) {
                    const float *xr[6];
                    const int na = mc_imin(ga, j1 - j);
                    for (int a = 0; a < na; a++) xr[a] = x + (size_t)(j + a) * K;
                    for (int r = rs; r < re; r += gw) {
                        const uint8_t *wr[4];
                        const int nw = mc_imin(gw, re - r);
                        for (int c = 0; c < nw; c++) wr[c] = W0 + (size_t)(r - r0 + c) * row_stride;
                        float *kp = keep == NULL ? NULL : keep + per * (size_t)(tiles_r * ((j - j0) / ga) + (r - rs) / gw);
                        fn(xr, wr, k0, k1, kp, k0 == 0, k1 == K, y + (size_t)j * ldy + r, ldy, pf, na, nw);
                    }
                }
            }
        }
    }
    return 0;
}

#endif /* MC_X86 */
#endif /* MC_GEMM_FLOAT_H */
