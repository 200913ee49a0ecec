/* Kernel dispatch: the dot kernels of each weight type at each SIMD level (NULL where a
 * type has none; mc_matmul then refuses the type, and the Python side keeps it on the
 * numpy fallback). */
#ifndef MC_DISPATCH_H
#define MC_DISPATCH_H

#include "mc_blocks.h"
#include "mc_dequant_avx2.h"
#include "mc_dot_avx2.h"
#include "mc_dot_avx2_more.h"
#include "mc_dot_neon.h"
#include "mc_dot_scalar.h"
#include "mc_mxfp4.h"

/* ----------------------------------------------------------------- dispatch */

static mc_dot_fn mc_pick_dot(int t, int simd) {
#if defined(MC_X86)
    if (simd == MC_SIMD_VNNI) {
        switch (t) {
        case MC_Q4_0: return mc_dot_q4_0_vnni;
        case MC_Q4_1: return mc_dot_q4_1_vnni;
        case MC_Q5_0: return mc_dot_q5_0_vnni;
        case MC_Q8_0: return mc_dot_q8_0_vnni;
        case MC_INT8: return mc_dot_int8_vnni;
        default: break; /* the rest: the AVX2 kernels */
        }
    }
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_F32: return mc_dot_f32_avx2;
        case MC_F16: return mc_dot_f16_avx2;
        case MC_Q4_0: return mc_dot_q4_0_avx2;
        case MC_Q4_1: return mc_dot_q4_1_avx2;
        case MC_Q5_0: return mc_dot_q5_0_avx2;
        case MC_Q8_0: return mc_dot_q8_0_avx2;
        case MC_Q4_K: return mc_dot_q4_k_avx2;
        case MC_Q6_K: return mc_dot_q6_k_avx2;
        case MC_INT8: return mc_dot_int8_avx2;
        case MC_Q5_1: return mc_dot_q5_1_avx2;
        case MC_Q2_K: return mc_dot_q2_k_avx2;
        case MC_Q3_K: return mc_dot_q3_k_avx2;
        case MC_Q5_K: return mc_dot_q5_k_avx2;
        case MC_BF16: return mc_dot_bf16_avx2;
        case MC_IQ4_NL: return mc_dot_iq4_nl_avx2;
        case MC_IQ4_XS: return mc_dot_iq4_xs_avx2;
        case MC_MXFP4: return mc_dot_mxfp4_avx2;
        default: return NULL;
        }
    }
#endif
#if defined(MC_NEON)
    if (simd == MC_SIMD_NEON) {
        switch (t) {
        case MC_F32: return mc_dot_f32_neon;
        case MC_Q4_0: return mc_dot_q4_0_neon;
        case MC_Q4_1: return mc_dot_q4_1_neon;
        case MC_Q8_0: return mc_dot_q8_0_neon;
        case MC_Q5_0: return mc_dot_q5_0_neon;
        case MC_Q4_K: return mc_dot_q4_k_neon;
        case MC_Q6_K: return mc_dot_q6_k_neon;
        case MC_F16: return mc_dot_f16_neon;
        case MC_INT8: return mc_dot_int8_neon;
        default: break;
        }
    }
#endif
    (void)simd;
    switch (t) {
    case MC_F32: return mc_dot_f32_scalar;
    case MC_F16: return mc_dot_f16_scalar;
    case MC_Q4_0: return mc_dot_q4_0_scalar;
    case MC_Q4_1: return mc_dot_q4_1_scalar;
    case MC_Q5_0: return mc_dot_q5_0_scalar;
    case MC_Q8_0: return mc_dot_q8_0_scalar;
    case MC_Q4_K: return mc_dot_q4_k_scalar;
    case MC_Q6_K: return mc_dot_q6_k_scalar;
    case MC_INT8: return mc_dot_int8_scalar;
    case MC_Q5_1: return mc_dot_q5_1_scalar;
    case MC_Q2_K: return mc_dot_q2_k_scalar;
    case MC_Q3_K: return mc_dot_q3_k_scalar;
    case MC_Q5_K: return mc_dot_q5_k_scalar;
    case MC_BF16: return mc_dot_bf16_scalar;
    case MC_IQ4_NL: return mc_dot_iq4_nl_scalar;
    case MC_IQ4_XS: return mc_dot_iq4_xs_scalar;
    case MC_MXFP4: return mc_dot_mxfp4_scalar;
    default: return NULL;
    }
}

/* whether mc_matmul has a kernel for type t at `simd` */
MC_API int mc_has_kernel(int t, int simd) { return mc_pick_dot(t, simd) != NULL; }

static mc_dot4_fn mc_pick_dot4(int t, int simd) {
#if defined(MC_X86)
    if (simd == MC_SIMD_VNNI) {
        switch (t) {
        case MC_INT8: return mc_dot4_int8_vnni;
        default: break;
        }
    }
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_K: return mc_dot4_q4_k_avx2;
        case MC_Q6_K: return mc_dot4_q6_k_avx2;
        case MC_INT8: return mc_dot4_int8_avx2;
        case MC_F32: return mc_dot4_f32_avx2;
        case MC_F16: return mc_dot4_f16_avx2;
        case MC_BF16: return mc_dot4_bf16_avx2;
        case MC_Q5_1: return mc_dot4_q5_1_avx2;
        case MC_Q2_K: return mc_dot4_q2_k_avx2;
        case MC_Q3_K: return mc_dot4_q3_k_avx2;
        case MC_Q5_K: return mc_dot4_q5_k_avx2;
        case MC_IQ4_NL: return mc_dot4_iq4_nl_avx2;
        case MC_IQ4_XS: return mc_dot4_iq4_xs_avx2;
        case MC_MXFP4: return mc_dot4_mxfp4_avx2;
        default: return NULL;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

static mc_dotr4_fn mc_pick_dotr4(int t, int simd) {
#if defined(MC_X86)
    if (simd == MC_SIMD_VNNI) {
        switch (t) {
        case MC_Q4_0: return mc_dotr4_q4_0_vnni;
        case MC_Q4_1: return mc_dotr4_q4_1_vnni;
        case MC_Q5_0: return mc_dotr4_q5_0_vnni;
        case MC_Q8_0: return mc_dotr4_q8_0_vnni;
        default: return NULL;
        }
    }
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_0: return mc_dotr4_q4_0_avx2;
        case MC_Q4_1: return mc_dotr4_q4_1_avx2;
        case MC_Q5_0: return mc_dotr4_q5_0_avx2;
        case MC_Q8_0: return mc_dotr4_q8_0_avx2;
        default: return NULL;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

static mc_dot8_fn mc_pick_dot8(int t, int simd) {
#if defined(MC_X86)
    /* VNNI: the GEMM of mc_gemm_vnni.h instead */
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_0: return mc_dot8_q4_0_avx2;
        case MC_Q4_1: return mc_dot8_q4_1_avx2;
        case MC_Q5_0: return mc_dot8_q5_0_avx2;
        case MC_Q8_0: return mc_dot8_q8_0_avx2;
        default: return NULL;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

/* the exact path's fused single-row kernel, where one exists */
static mc_dot_fn mc_pick_fdot(int t, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_0: return mc_fdot_q4_0_avx2;
        case MC_Q4_1: return mc_fdot_q4_1_avx2;
        case MC_Q5_0: return mc_fdot_q5_0_avx2;
        case MC_Q8_0: return mc_fdot_q8_0_avx2;
        case MC_Q4_K: return mc_fdot_q4_k_avx2;
        case MC_Q6_K: return mc_fdot_q6_k_avx2;
        case MC_Q5_1: return mc_fdot_q5_1_avx2;
        case MC_Q2_K: return mc_fdot_q2_k_avx2;
        case MC_Q3_K: return mc_fdot_q3_k_avx2;
        case MC_Q5_K: return mc_fdot_q5_k_avx2;
        case MC_IQ4_NL: return mc_fdot_iq4_nl_avx2;
        case MC_IQ4_XS: return mc_fdot_iq4_xs_avx2;
        case MC_MXFP4: return mc_fdot_mxfp4_avx2;
        default: break;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

static mc_dot_fn mc_pick_dot_f32(int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) return mc_dot_f32_avx2;
#endif
#if defined(MC_NEON)
    if (simd == MC_SIMD_NEON) return mc_dot_f32_neon;
#endif
    (void)simd;
    return mc_dot_f32_scalar;
}

#endif /* MC_DISPATCH_H */
