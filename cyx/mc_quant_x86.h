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


/* Every 32-element-block kernel, single-row or 8-row, computes per row and block the
 * exact integer dot s of the block's ints, then acc = fma(dw * dx, (float)s, acc) in
 * block order (Q4_1 adds sum(mw * sx) kept apart and added at the end), so a row's
 * result does not depend on how many rows share the call. */

MC_TGT static inline float MC_SFX(mc_fma1)(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

#define MC_BLOCK_ACC(acc, dd, p) acc = MC_SFX(mc_fma1)(dd, (float)mc_hsum256_i32(p), acc)

MC_TGT static float MC_SFX(mc_dot_q4_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float acc = 0.0f;
    const __m256i off = _mm256_set1_epi8(8);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const __m256i qw = _mm256_sub_epi8(mc_nibbles32(b + 2), off);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        MC_BLOCK_ACC(acc, mc_h16(b) * x[i].d, MC_SFX(mc_dot_i8)(qw, qx));
    }
    return acc;
}

MC_TGT static float MC_SFX(mc_dot_q4_1)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float acc = 0.0f, summ = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        const __m256i qw = mc_nibbles32(b + 4);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        MC_BLOCK_ACC(acc, mc_h16(b) * x[i].d, MC_SFX(mc_dot_u8)(qw, qx));
        summ += mc_h16(b + 2) * x[i].s;
    }
    return acc + summ;
}

MC_TGT static float MC_SFX(mc_dot_q5_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float acc = 0.0f;
    const __m256i f0 = _mm256_set1_epi8((char)0xF0);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        __m256i qw = mc_nibbles32(b + 6);
        /* high bit clear -> value - 16 == nibble | 0xF0 as int8 */
        qw = _mm256_or_si256(qw, _mm256_andnot_si256(mc_bits32(b + 2), f0));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        MC_BLOCK_ACC(acc, mc_h16(b) * x[i].d, MC_SFX(mc_dot_i8)(qw, qx));
    }
    return acc;
}

MC_TGT static float MC_SFX(mc_dot_q8_0)(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float acc = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        MC_BLOCK_ACC(acc, mc_h16(b) * x[i].d, MC_SFX(mc_dot_i8)(qw, qx));
    }
    return acc;
}
#undef MC_BLOCK_ACC

/* ---- four weight rows against one activation row: the single-row arithmetic for each
 * (exact block sums, then fma(dw * dx, s, acc) in block order), four chains in the
 * lanes of one vector so the FMA latency is paid once for four rows. */
MC_TGT static inline __m128 MC_SFX(mc_h16x4)(const uint8_t *w, size_t st, size_t off) {
    uint16_t h0, h1, h2, h3; /* into a register lane by lane: no store-to-load round trip */
    memcpy(&h0, w + off, 2);
    memcpy(&h1, w + st + off, 2);
    memcpy(&h2, w + 2 * st + off, 2);
    memcpy(&h3, w + 3 * st + off, 2);
    __m128i h = _mm_cvtsi32_si128(h0);
    h = _mm_insert_epi16(h, h1, 1);
    h = _mm_insert_epi16(h, h2, 2);
    h = _mm_insert_epi16(h, h3, 3);
    return _mm_cvtph_ps(h);
}

/* four rows' 8-lane int sums -> one vector of their four totals */
MC_TGT static inline __m128i MC_SFX(mc_sum4_i32)(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

#define MC_DOTR4(BYTES, DOFF, BLOCKDOT, MIN)                                                       \
    const mc_q8 *x = (const mc_q8 *)xv;                                                            \
    __m128 acc = _mm_setzero_ps(), summ = _mm_setzero_ps();                                        \
    for (int i = 0; i < K / 32; i++) {                                                             \
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);                           \
        const uint8_t *b0 = w + (BYTES) * i;                                                       \
        { /* prefetch the next 4 rows, 128 bytes a block (4 row streams outrun the hardware) */ \
            _mm_prefetch((const char *)w + 4 * st + 128 * i, _MM_HINT_T0);                         \
            _mm_prefetch((const char *)w + 4 * st + 128 * i + 64, _MM_HINT_T0);                    \
        }                                                                                          \
        const __m128i is = MC_SFX(mc_sum4_i32)(BLOCKDOT(b0), BLOCKDOT(b0 + st),                    \
                                               BLOCKDOT(b0 + 2 * st), BLOCKDOT(b0 + 3 * st));      \
        const __m128 dd = _mm_mul_ps(MC_SFX(mc_h16x4)(w, st, (BYTES) * i + (DOFF)),                \
                                     _mm_set1_ps(x[i].d));                                         \
        acc = _mm_fmadd_ps(dd, _mm_cvtepi32_ps(is), acc);                                          \
        if (MIN)                                                                                   \
            summ = _mm_add_ps(summ, _mm_mul_ps(MC_SFX(mc_h16x4)(w, st, (BYTES) * i + 2),           \
                                               _mm_set1_ps(x[i].s)));                              \
    }                                                                                              \
    _mm_storeu_ps(out, MIN ? _mm_add_ps(acc, summ) : acc)

#define MC_BD_Q4_1(b) MC_SFX(mc_dot_u8)(mc_nibbles32((b) + 4), qx)
#define MC_BD_Q4_0(b) MC_SFX(mc_dot_i8)(_mm256_sub_epi8(mc_nibbles32((b) + 2), _mm256_set1_epi8(8)), qx)
#define MC_BD_Q5_0(b)                                                                              \
    MC_SFX(mc_dot_i8)(_mm256_or_si256(mc_nibbles32((b) + 6),                                       \
                                      _mm256_andnot_si256(mc_bits32((b) + 2),                      \
                                                          _mm256_set1_epi8((char)0xF0))),          \
                      qx)
#define MC_BD_Q8_0(b) MC_SFX(mc_dot_i8)(_mm256_loadu_si256((const __m256i *)((b) + 2)), qx)

MC_TGT static void MC_SFX(mc_dotr4_q4_1)(int K, const uint8_t *w, size_t st, const void *xv,
                                         float *out) {
    MC_DOTR4(20, 0, MC_BD_Q4_1, 1);
}
MC_TGT static void MC_SFX(mc_dotr4_q4_0)(int K, const uint8_t *w, size_t st, const void *xv,
                                         float *out) {
    MC_DOTR4(18, 0, MC_BD_Q4_0, 0);
}
MC_TGT static void MC_SFX(mc_dotr4_q5_0)(int K, const uint8_t *w, size_t st, const void *xv,
                                         float *out) {
    MC_DOTR4(22, 0, MC_BD_Q5_0, 0);
}
MC_TGT static void MC_SFX(mc_dotr4_q8_0)(int K, const uint8_t *w, size_t st, const void *xv,
                                         float *out) {
    MC_DOTR4(34, 0, MC_BD_Q8_0, 0);
}
#undef MC_DOTR4
#undef MC_BD_Q4_1
#undef MC_BD_Q4_0
#undef MC_BD_Q5_0
#undef MC_BD_Q8_0

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

#undef MC_ACC_I8

#if !MC_DPBUSD /* VNNI: the GEMM of mc_gemm_vnni.h */
/* ---- eight activation rows per weight row: the batched kernels.
 * `xp`: the rows' mc_q8 blocks repacked (struct mc_q8x8): rows paired, elements 0-15
 * of rows 2p and 2p+1 in the two 128-bit halves of `lo[p]`, elements 16-31 in
 * `hi[p]`.  The weight block's elements 0-15 (and 16-31) are broadcast to both
 * halves, so two integer dots fill one vector with 4 partial sums of each row of a
 * pair; three horizontal adds leave the 8 rows' exact block sums in one vector, in
 * lane order 0 2 4 6 1 3 5 7 (the order of d, s and cs).  Then one convert and one
 * FMA per block serve all 8 rows: the single-row kernels' arithmetic, lane by lane.
 * Weights are unsigned here: q + c (c = 8 for Q4_0, 16 for Q5_0; Q8_0 stays signed),
 * and cs holds c * sum(x) to take back. */
#define MC_PAIRDOT(wl, wh, xl, xh) _mm256_add_epi32(MC_SUM_U8I8(wl, xl), MC_SUM_U8I8(wh, xh))
#define MC_XL(p) _mm256_load_si256((const __m256i *)xb[i].lo[p])
#define MC_XH(p) _mm256_load_si256((const __m256i *)xb[i].hi[p])

/* the 8 rows' exact int sums with unsigned weight halves wl, wh */
#define MC_ROWSUMS_U8(wl, wh)                                                                      \
    _mm256_hadd_epi32(_mm256_hadd_epi32(MC_PAIRDOT(wl, wh, MC_XL(0), MC_XH(0)),                    \
                                        MC_PAIRDOT(wl, wh, MC_XL(1), MC_XH(1))),                   \
                      _mm256_hadd_epi32(MC_PAIRDOT(wl, wh, MC_XL(2), MC_XH(2)),                    \
                                        MC_PAIRDOT(wl, wh, MC_XL(3), MC_XH(3))))

#define MC_DOT8_ACC(isum, dw)                                                                      \
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dw), _mm256_load_ps(xb[i].d)),              \
                          _mm256_cvtepi32_ps(isum), acc)

/* out[row] from the lane-ordered vector */
MC_TGT static inline void MC_SFX(mc_dot8_out)(__m256 v, float *out) {
    float l[8];
    _mm256_storeu_ps(l, v);
    out[0] = l[0], out[2] = l[1], out[4] = l[2], out[6] = l[3];
    out[1] = l[4], out[3] = l[5], out[5] = l[6], out[7] = l[7];
}

MC_TGT static inline __m256i MC_SFX(mc_bcast128)(const uint8_t *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

MC_TGT static void MC_SFX(mc_dot8_q4_1)(int K, const uint8_t *w, const void *xp, float *out) {
    const mc_q8x8 *xb = (const mc_q8x8 *)xp;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps(), summ = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        const __m256i t = MC_SFX(mc_bcast128)(b + 4);
        const __m256i wl = _mm256_and_si256(t, m4), wh = _mm256_and_si256(_mm256_srli_epi16(t, 4), m4);
        MC_DOT8_ACC(MC_ROWSUMS_U8(wl, wh), mc_h16(b));
        summ = _mm256_add_ps(summ, _mm256_mul_ps(_mm256_set1_ps(mc_h16(b + 2)), _mm256_load_ps(xb[i].s)));
    }
    MC_SFX(mc_dot8_out)(_mm256_add_ps(acc, summ), out);
}


MC_TGT static void MC_SFX(mc_dot8_q4_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const mc_q8x8 *xb = (const mc_q8x8 *)xp;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const __m256i t = MC_SFX(mc_bcast128)(b + 2);
        const __m256i wl = _mm256_and_si256(t, m4), wh = _mm256_and_si256(_mm256_srli_epi16(t, 4), m4);
        const __m256i cs = _mm256_load_si256((const __m256i *)xb[i].cs);
        MC_DOT8_ACC(_mm256_sub_epi32(MC_ROWSUMS_U8(wl, wh), cs), mc_h16(b));
    }
    MC_SFX(mc_dot8_out)(acc, out);
}

MC_TGT static void MC_SFX(mc_dot8_q5_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const mc_q8x8 *xb = (const mc_q8x8 *)xp;
    const __m256i h = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        const __m256i q = _mm256_or_si256(mc_nibbles32(b + 6), _mm256_and_si256(mc_bits32(b + 2), h));
        const __m256i wl = _mm256_permute4x64_epi64(q, 0x44), wh = _mm256_permute4x64_epi64(q, 0xEE);
        const __m256i cs = _mm256_load_si256((const __m256i *)xb[i].cs);
        MC_DOT8_ACC(_mm256_sub_epi32(MC_ROWSUMS_U8(wl, wh), cs), mc_h16(b));
    }
    MC_SFX(mc_dot8_out)(acc, out);
}

MC_TGT static void MC_SFX(mc_dot8_q8_0)(int K, const uint8_t *w, const void *xp, float *out) {
    const mc_q8x8 *xb = (const mc_q8x8 *)xp;
    __m256 acc = _mm256_setzero_ps();
    /* signed weights: maddubs(|w|, sign(x, w)), the sign fix-up per row pair */
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const __m256i wl = MC_SFX(mc_bcast128)(b + 2), wh = MC_SFX(mc_bcast128)(b + 18);
        const __m256i al = _mm256_sign_epi8(wl, wl), ah = _mm256_sign_epi8(wh, wh);
#define MC_SP(p)                                                                                   \
    MC_PAIRDOT(al, ah, _mm256_sign_epi8(MC_XL(p), wl), _mm256_sign_epi8(MC_XH(p), wh))
        const __m256i isum = _mm256_hadd_epi32(_mm256_hadd_epi32(MC_SP(0), MC_SP(1)),
                                               _mm256_hadd_epi32(MC_SP(2), MC_SP(3)));
#undef MC_SP
        MC_DOT8_ACC(isum, mc_h16(b));
    }
    MC_SFX(mc_dot8_out)(acc, out);
}

#undef MC_PAIRDOT
#undef MC_XL
#undef MC_XH
#undef MC_ROWSUMS_U8
#undef MC_DOT8_ACC
#endif /* !MC_DPBUSD */
