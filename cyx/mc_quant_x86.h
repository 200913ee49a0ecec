/* The 32-element-block integer dot kernels, included twice by mc_dot_avx2.h:
 * once for AVX2 (MC_SUM_U8I8 = maddubs + madd) and once for AVX512-VNNI on
 * 256-bit registers (MC_SUM_U8I8 = vpdpbusd).  Every product stays far from
 * int16 saturation (|w| <= 128, |x| <= 127, pairs <= 32512), so both builds give
 * bit-identical results.  No include guard, on purpose.
 *
 * Expects: MC_TGT (target attribute), MC_SFX(name) (name suffix),
 * MC_SUM_U8I8(u8, i8) -> 8 int32 sums of 4 products each (u8 unsigned).
 */

/* signed x signed int8, 32 lanes -> 8 int32 partial sums */
MC_TGT static inline __m256i MC_SFX(mc_dot_i8)(__m256i a, __m256i b) {
    const __m256i ax = _mm256_sign_epi8(a, a);
    const __m256i sb = _mm256_sign_epi8(b, a);
    return MC_SUM_U8I8(ax, sb);
}

/* unsigned (<128) x signed int8 -> 8 int32 partial sums */
MC_TGT static inline __m256i MC_SFX(mc_dot_u8)(__m256i ua, __m256i b) {
    return MC_SUM_U8I8(ua, b);
}

MC_TGT static float MC_SFX(mc_dot_q4_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    __m256 acc = _mm256_setzero_ps();
    const __m256i off = _mm256_set1_epi8(8);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const __m256i qw = _mm256_sub_epi8(mc_nibbles32(b + 2), off);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 p = _mm256_cvtepi32_ps(MC_SFX(mc_dot_i8)(qw, qx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b) * x[i].d), p, acc);
    }
    return mc_hsum256(acc);
}

MC_TGT static float MC_SFX(mc_dot_q4_1)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        const __m256i qw = mc_nibbles32(b + 4);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 p = _mm256_cvtepi32_ps(MC_SFX(mc_dot_u8)(qw, qx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b) * x[i].d), p, acc);
        summ += mc_h16(b + 2) * x[i].s;
    }
    return mc_hsum256(acc) + summ;
}

MC_TGT static float MC_SFX(mc_dot_q5_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    __m256 acc = _mm256_setzero_ps();
    const __m256i f0 = _mm256_set1_epi8((char)0xF0);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        __m256i qw = mc_nibbles32(b + 6);
        /* high bit clear -> value - 16 == nibble | 0xF0 as int8 */
        qw = _mm256_or_si256(qw, _mm256_andnot_si256(mc_bits32(b + 2), f0));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 p = _mm256_cvtepi32_ps(MC_SFX(mc_dot_i8)(qw, qx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b) * x[i].d), p, acc);
    }
    return mc_hsum256(acc);
}

MC_TGT static float MC_SFX(mc_dot_q8_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 p = _mm256_cvtepi32_ps(MC_SFX(mc_dot_i8)(qw, qx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b) * x[i].d), p, acc);
    }
    return mc_hsum256(acc);
}

MC_TGT static float MC_SFX(mc_dot_int8)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    const int8_t *q = (const int8_t *)(w + 4);
    __m256 acc = _mm256_setzero_ps();
    const int nb = K / 32;
    for (int i = 0; i < nb; i++) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 p = _mm256_cvtepi32_ps(MC_SFX(mc_dot_i8)(qw, qx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d), p, acc);
    }
    float sum = mc_hsum256(acc);
    if (K % 32) {
        int s = 0;
        for (int j = 0; j < K % 32; j++) s += q[32 * nb + j] * x[nb].qs[j];
        sum += x[nb].d * (float)s;
    }
    return sum * mc_load_f32(w);
}

/* signed 32-lane weight vector `qw` against row r's block i */
#define MC_ACC_I8(r, qw, ax, dw)                                                                   \
    do {                                                                                           \
        const mc_q8 *xb = MC_X4(r) + i;                                                            \
        const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xb->qs), qw);       \
        const __m256i p = MC_SUM_U8I8(ax, sy);  \
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps((dw) * xb->d), _mm256_cvtepi32_ps(p), acc[r]);     \
    } while (0)

MC_TGT static void MC_SFX(mc_dot4_q8_0)(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const float dw = mc_h16(b);
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256i ax = _mm256_sign_epi8(qw, qw);
        MC_ACC_I8(0, qw, ax, dw);
        MC_ACC_I8(1, qw, ax, dw);
        MC_ACC_I8(2, qw, ax, dw);
        MC_ACC_I8(3, qw, ax, dw);
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]);
}

MC_TGT static void MC_SFX(mc_dot4_q4_0)(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    const __m256i off = _mm256_set1_epi8(8);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const float dw = mc_h16(b);
        const __m256i qw = _mm256_sub_epi8(mc_nibbles32(b + 2), off);
        const __m256i ax = _mm256_sign_epi8(qw, qw);
        MC_ACC_I8(0, qw, ax, dw);
        MC_ACC_I8(1, qw, ax, dw);
        MC_ACC_I8(2, qw, ax, dw);
        MC_ACC_I8(3, qw, ax, dw);
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]);
}

MC_TGT static void MC_SFX(mc_dot4_q5_0)(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    const __m256i f0 = _mm256_set1_epi8((char)0xF0);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        const float dw = mc_h16(b);
        __m256i qw = mc_nibbles32(b + 6);
        qw = _mm256_or_si256(qw, _mm256_andnot_si256(mc_bits32(b + 2), f0));
        const __m256i ax = _mm256_sign_epi8(qw, qw);
        MC_ACC_I8(0, qw, ax, dw);
        MC_ACC_I8(1, qw, ax, dw);
        MC_ACC_I8(2, qw, ax, dw);
        MC_ACC_I8(3, qw, ax, dw);
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]);
}

MC_TGT static void MC_SFX(mc_dot4_int8)(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    /* the ragged tail and the row scale go through the single-row kernel's code */
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    const int8_t *q = (const int8_t *)(w + 4);
    const int nb = K / 32;
    for (int i = 0; i < nb; i++) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        const __m256i ax = _mm256_sign_epi8(qw, qw);
        MC_ACC_I8(0, qw, ax, 1.0f);
        MC_ACC_I8(1, qw, ax, 1.0f);
        MC_ACC_I8(2, qw, ax, 1.0f);
        MC_ACC_I8(3, qw, ax, 1.0f);
    }
    for (int r = 0; r < 4; r++) {
        float sum = mc_hsum256(acc[r]);
        if (K % 32) {
            int s = 0;
            for (int j = 0; j < K % 32; j++) s += q[32 * nb + j] * MC_X4(r)[nb].qs[j];
            sum += MC_X4(r)[nb].d * (float)s;
        }
        out[r] = sum * mc_load_f32(w);
    }
}

#define MC_ACC_U8(r, qw, dw, mw)                                                                   \
    do {                                                                                           \
        const mc_q8 *xb = MC_X4(r) + i;                                                            \
        const __m256i p = MC_SUM_U8I8(qw, _mm256_loadu_si256((const __m256i *)xb->qs));          \
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps((dw) * xb->d), _mm256_cvtepi32_ps(p), acc[r]);     \
        summ[r] += (mw) * xb->s;                                                                   \
    } while (0)

MC_TGT static void MC_SFX(mc_dot4_q4_1)(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float summ[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        const float dw = mc_h16(b), mw = mc_h16(b + 2);
        const __m256i qw = mc_nibbles32(b + 4);
        MC_ACC_U8(0, qw, dw, mw);
        MC_ACC_U8(1, qw, dw, mw);
        MC_ACC_U8(2, qw, dw, mw);
        MC_ACC_U8(3, qw, dw, mw);
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]) + summ[r];
}

#undef MC_ACC_I8
#undef MC_ACC_U8

/* ---- eight activation rows per weight row: the batched kernels.
 * `xp`: those rows' mc_q8 blocks repacked by block (struct mc_q8x8: the 8 scales d,
 * the 8 sums s, the 8 rows' int8 values), so every load is at a fixed offset from
 * one pointer.  The blocks go 16 at a time: first one vector multiply per block
 * makes its 8 scale products dw * d_r (and Q4_1's 8 min terms), stored; then each
 * row's integer dot meets its product by a broadcast load, so a pair costs one
 * integer dot, one convert and one FMA.  Per row the arithmetic is exactly the
 * single-row kernel's (same products, same order, no contraction), so results are
 * bit-identical to eight separate calls. */
#define MC_DOT8_CHUNK 16

/* Loop over the weight row's blocks of BYTES bytes (block pointer `b`, index `i`):
 * SCALES sets `dwv` (and may add the min terms), PREP unpacks the weight block,
 * PAIR(r) gives row r's 8 int32 sums. */
#define MC_DOT8_LOOP(BYTES, SCALES, PREP, PAIR)                                                    \
    const mc_q8x8 *xb = (const mc_q8x8 *)xp;                                                       \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,         \
           a7 = a0;                                                                                \
    float pd[MC_DOT8_CHUNK][8] __attribute__((aligned(32)));                                       \
    const int nb = K / 32;                                                                         \
    for (int i0 = 0; i0 < nb; i0 += MC_DOT8_CHUNK) {                                               \
        const int i1 = mc_imin(nb, i0 + MC_DOT8_CHUNK);                                            \
        for (int i = i0; i < i1; i++) {                                                            \
            const uint8_t *b = w + (BYTES) * i;                                                    \
            __m256 dwv;                                                                            \
            SCALES;                                                                                \
            _mm256_store_ps(pd[i - i0], _mm256_mul_ps(dwv, _mm256_load_ps(xb[i].d)));              \
        }                                                                                          \
        for (int i = i0; i < i1; i++) {                                                            \
            const uint8_t *b = w + (BYTES) * i;                                                    \
            const float *p = pd[i - i0];                                                           \
            PREP;                                                                                  \
            MC_DOT8_ROW(a0, 0, PAIR);                                                              \
            MC_DOT8_ROW(a1, 1, PAIR);                                                              \
            MC_DOT8_ROW(a2, 2, PAIR);                                                              \
            MC_DOT8_ROW(a3, 3, PAIR);                                                              \
            MC_DOT8_ROW(a4, 4, PAIR);                                                              \
            MC_DOT8_ROW(a5, 5, PAIR);                                                              \
            MC_DOT8_ROW(a6, 6, PAIR);                                                              \
            MC_DOT8_ROW(a7, 7, PAIR);                                                              \
        }                                                                                          \
    }
#define MC_DOT8_ROW(a, r, PAIR)                                                                    \
    a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (r)), _mm256_cvtepi32_ps(PAIR(r)), a)

#define MC_DOT8_OUT(s)                                                                             \
    do {                                                                                           \
        out[0] = mc_hsum256(a0) + (s)[0];                                                          \
        out[1] = mc_hsum256(a1) + (s)[1];                                                          \
        out[2] = mc_hsum256(a2) + (s)[2];                                                          \
        out[3] = mc_hsum256(a3) + (s)[3];                                                          \
        out[4] = mc_hsum256(a4) + (s)[4];                                                          \
        out[5] = mc_hsum256(a5) + (s)[5];                                                          \
        out[6] = mc_hsum256(a6) + (s)[6];                                                          \
        out[7] = mc_hsum256(a7) + (s)[7];                                                          \
    } while (0)

#define MC_XQ(r) _mm256_load_si256((const __m256i *)xb[i].qs[r])
#define MC_PAIR_U8(r) MC_SUM_U8I8(qw, MC_XQ(r))
#define MC_PAIR_I8(r) MC_SUM_U8I8(ax, _mm256_sign_epi8(MC_XQ(r), qw))
#define MC_DW dwv = _mm256_set1_ps(mc_h16(b))

MC_TGT static void MC_SFX(mc_dot8_q4_1)(int K, const uint8_t *w, const void *xp, float *out) {
    __m256 summ = _mm256_setzero_ps();
    MC_DOT8_LOOP(20,
                 MC_DW;
                 summ = _mm256_add_ps(summ, _mm256_mul_ps(_mm256_set1_ps(mc_h16(b + 2)),
                                                          _mm256_load_ps(xb[i].s))),
                 const __m256i qw = mc_nibbles32(b + 4), MC_PAIR_U8)
    float s[8];
    _mm256_storeu_ps(s, summ);
    MC_DOT8_OUT(s);
}

static const float MC_SFX(mc_zero8)[8];

#if MC_DPBUSD
/* VNNI: the weights offset to unsigned (q + c, c = 8, 16 or 128) meet x in vpdpbusd,
 * which starts from the row's precomputed lanes -c * (sum of each 4 x values): the
 * int32 lanes are exactly the signed kernels' (integer sums), without a sign fix-up
 * per row. */
#define MC_PAIR_OFF(r)                                                                             \
    _mm256_dpbusd_epi32(_mm256_load_si256((const __m256i *)xb[i].corr[r]), qu, MC_XQ(r))

MC_TGT static void MC_SFX(mc_dot8_q4_0)(int K, const uint8_t *w, const void *xp, float *out) {
    MC_DOT8_LOOP(18, MC_DW, const __m256i qu = mc_nibbles32(b + 2), MC_PAIR_OFF)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}

MC_TGT static void MC_SFX(mc_dot8_q5_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const __m256i h = _mm256_set1_epi8(0x10);
    MC_DOT8_LOOP(22, MC_DW,
                 const __m256i qu = _mm256_or_si256(mc_nibbles32(b + 6),
                                                    _mm256_and_si256(mc_bits32(b + 2), h)),
                 MC_PAIR_OFF)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}

MC_TGT static void MC_SFX(mc_dot8_q8_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const __m256i c = _mm256_set1_epi8((char)0x80);
    MC_DOT8_LOOP(34, MC_DW,
                 const __m256i qu =
                     _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), c),
                 MC_PAIR_OFF)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}
#undef MC_PAIR_OFF
#else
MC_TGT static void MC_SFX(mc_dot8_q4_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const __m256i off = _mm256_set1_epi8(8);
    MC_DOT8_LOOP(18, MC_DW,
                 const __m256i qw = _mm256_sub_epi8(mc_nibbles32(b + 2), off);
                 const __m256i ax = _mm256_sign_epi8(qw, qw), MC_PAIR_I8)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}

MC_TGT static void MC_SFX(mc_dot8_q5_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const __m256i f0 = _mm256_set1_epi8((char)0xF0);
    MC_DOT8_LOOP(22, MC_DW,
                 const __m256i qw = _mm256_or_si256(mc_nibbles32(b + 6),
                                                    _mm256_andnot_si256(mc_bits32(b + 2), f0));
                 const __m256i ax = _mm256_sign_epi8(qw, qw), MC_PAIR_I8)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}

MC_TGT static void MC_SFX(mc_dot8_q8_0)(int K, const uint8_t *w, const void *xp, float *out) {
    MC_DOT8_LOOP(34, MC_DW,
                 const __m256i qw = _mm256_loadu_si256((const __m256i *)(b + 2));
                 const __m256i ax = _mm256_sign_epi8(qw, qw), MC_PAIR_I8)
    MC_DOT8_OUT(MC_SFX(mc_zero8));
}
#endif /* MC_DPBUSD */

#undef MC_DOT8_LOOP
#undef MC_DOT8_ROW
#undef MC_DOT8_OUT
#undef MC_XQ
#undef MC_PAIR_U8
#undef MC_PAIR_I8
#undef MC_DW
