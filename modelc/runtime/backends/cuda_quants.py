"""CUDA C for unpacking every GGUF block type the CUDA backend keeps on the GPU: F32, F16,
BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4
(Q5_0 and after in session 17, MXFP4 -- gpt-oss's experts -- and BF16 in session 37; they
were widened at upload before: MXFP4 to f16, 3.8x the memory, BF16 to f32, 2x).

``DEQ32`` holds each type's ``deq32<T>`` (one 32-weight group: the lane-a-group GEMV and
the row dequantizer before cuBLAS), spliced into :mod:`.cuda_src` after the template's
declaration; ``DEQ4`` each ``deq4<T>`` (four weights of a group: the coalesced GEMV),
spliced into :mod:`.cuda_gemv`.  The float steps are :mod:`modelc.formats.quants`' in
the same order (``d * q`` then ``- m`` or ``+ m``, each rounded), so values agree bit for
bit with it (``tests/test_cuda_quants_host.py`` compiles this for the CPU to check).
"""

from __future__ import annotations

# GGML's numbers: Q5_0 Q5_1 Q2_K Q3_K Q5_K IQ4_NL IQ4_XS BF16 MXFP4
TYPES = (6, 7, 10, 11, 13, 20, 23, 30, 39)

DEQ32 = r"""
// IQ4_NL / IQ4_XS's 16 levels {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
// 69, 89, 113} as bytes in four words, picked by byte permutes: no memory, and no constant-
// cache serialisation when a warp's lanes want different levels (a 1.1B IQ4_XS step 5.0 -> 2.3 ms)
__device__ __forceinline__ float iq4_level(u32 i) {
  u32 lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, i & 7), hi = __byte_perm(0x26190D01u, 0x71594535u, i & 7);
  return (float)(signed char)((i & 8 ? hi : lo) & 0xff);
}
// MXFP4's 16 levels (ggml's kvalues_mxfp4: the E2M1 values doubled) {0, 1, 2, 3, 4, 6, 8, 12,
// 0, -1, -2, -3, -4, -6, -8, -12}, picked the same way
__device__ __forceinline__ float mxfp4_level(u32 i) {
  u32 lo = __byte_perm(0x03020100u, 0x0C080604u, i & 7), hi = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, i & 7);
  return (float)(signed char)((i & 8 ? hi : lo) & 0xff);
}
// an E8M0 scale halved (ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), subnormal below e = 2),
// the doubled levels' match
__device__ __forceinline__ float e8m0_half(u32 e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Q4_K / Q5_K: the 6-bit scale and min of group s (0..7) of a super-block
__device__ __forceinline__ void k_scale_min(const u8* __restrict__ S, int s, int* sc, int* mn) {
  if (s < 4) { *sc = S[s] & 63; *mn = S[s+4] & 63; }
  else { *sc = (S[s+4] & 15) | ((S[s-4] >> 6) << 4); *mn = (S[s+4] >> 4) | ((S[s] >> 6) << 4); }
}
// Q3_K: the signed 6-bit scale of sub-block t (0..15) of 16 weights
__device__ __forceinline__ int q3k_scale(const u8* __restrict__ b, int t) {
  int lo = t < 8 ? (b[96 + t] & 15) : (b[88 + t] >> 4);
  int hi = (b[104 + (t & 3)] >> (2 * (t >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

template <> __device__ __forceinline__ void deq32<0>(const u8* __restrict__ row, int g, float* w) {
  const float4* p = (const float4*)(row + (size_t)g * 128);
#pragma unroll
  for (int i = 0; i < 8; i++) { float4 v = p[i]; w[4*i] = v.x; w[4*i+1] = v.y; w[4*i+2] = v.z; w[4*i+3] = v.w; }
}
template <> __device__ __forceinline__ void deq32<1>(const u8* __restrict__ row, int g, float* w) {
  const u8* b = row + (size_t)g * 64;
#pragma unroll
  for (int i = 0; i < 16; i++) { u32 v = ld32(b + 4*i); w[2*i] = h2f(v & 0xffff); w[2*i+1] = h2f(v >> 16); }
}
template <> __device__ __forceinline__ void deq32<2>(const u8* __restrict__ row, int g, float* w) {  // Q4_0
  const u8* b = row + (size_t)g * 18;
  float d = h2f(ld16(b));
#pragma unroll
  for (int i = 0; i < 8; i++) {
    u32 v = ld16(b + 2 + 2*i);
    u32 lo = v & 0xff, hi = v >> 8;
    w[2*i] = __fmul_rn(d, (float)((int)(lo & 15) - 8)); w[2*i+1] = __fmul_rn(d, (float)((int)(hi & 15) - 8));
    w[2*i+16] = __fmul_rn(d, (float)((int)(lo >> 4) - 8)); w[2*i+17] = __fmul_rn(d, (float)((int)(hi >> 4) - 8));
  }
}
template <> __device__ __forceinline__ void deq32<3>(const u8* __restrict__ row, int g, float* w) {  // Q4_1
  const u8* b = row + (size_t)g * 20;
  float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
#pragma unroll
  for (int i = 0; i < 4; i++) {
    u32 v = ld32(b + 4 + 4*i);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      u32 q = (v >> (8*k)) & 0xff;
      w[4*i+k] = __fadd_rn(__fmul_rn(d, (float)(q & 15)), m);
      w[4*i+k+16] = __fadd_rn(__fmul_rn(d, (float)(q >> 4)), m);
    }
  }
}
template <> __device__ __forceinline__ void deq32<8>(const u8* __restrict__ row, int g, float* w) {  // Q8_0
  const u8* b = row + (size_t)g * 34;
  float d = h2f(ld16(b));
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = ld16(b + 2 + 2*i);
    w[2*i] = __fmul_rn((float)(signed char)(v & 0xff), d); w[2*i+1] = __fmul_rn((float)(signed char)(v >> 8), d);
  }
}
template <> __device__ __forceinline__ void deq32<12>(const u8* __restrict__ row, int g, float* w) {  // Q4_K
  const u8* b = row + (size_t)(g >> 3) * 144;
  int s = g & 7;
  float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
  const u8* S = b + 4;
  int sc, mn;
  if (s < 4) { sc = S[s] & 63; mn = S[s+4] & 63; }
  else { sc = (S[s+4] & 15) | ((S[s-4] >> 6) << 4); mn = (S[s+4] >> 4) | ((S[s] >> 6) << 4); }
  float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
  const u8* qs = b + 16 + (s >> 1) * 32;
  int sh = (s & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    u32 v = ld32(qs + 4*i);
#pragma unroll
    for (int k = 0; k < 4; k++) w[4*i+k] = __fsub_rn(__fmul_rn(dl, (float)((v >> (8*k + sh)) & 15)), ml);
  }
}
template <> __device__ __forceinline__ void deq32<14>(const u8* __restrict__ row, int g, float* w) {  // Q6_K
  const u8* b = row + (size_t)(g >> 3) * 210;
  int s = g & 7, r = s >> 2, f = s & 3;
  const u8* ql = b + r * 64 + (f & 1) * 32;
  int lsh = (f >> 1) * 4;
  const u8* qh = b + 128 + r * 32;
  float d = h2f(ld16(b + 208));
  float d0 = __fmul_rn(d, (float)(signed char)b[192 + 2*s]);
  float d1 = __fmul_rn(d, (float)(signed char)b[192 + 2*s + 1]);
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 l = ld16(ql + 2*i), h = ld16(qh + 2*i);
#pragma unroll
    for (int k = 0; k < 2; k++) {
      int j = 2*i + k;
      int q = (int)(((l >> (8*k + lsh)) & 15) | (((h >> (8*k + 2*f)) & 3) << 4)) - 32;
      w[j] = __fmul_rn(j < 16 ? d0 : d1, (float)q);
    }
  }
}
template <> __device__ __forceinline__ void deq32<6>(const u8* __restrict__ row, int g, float* w) {  // Q5_0
  const u8* b = row + (size_t)g * 22;
  float d = h2f(ld16(b));
  u32 qh = ld16(b + 2) | ((u32)ld16(b + 4) << 16);
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = b[6 + i];
    w[i] = __fmul_rn(d, (float)((int)((v & 15) | (((qh >> i) & 1) << 4)) - 16));
    w[i + 16] = __fmul_rn(d, (float)((int)((v >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16));
  }
}
template <> __device__ __forceinline__ void deq32<7>(const u8* __restrict__ row, int g, float* w) {  // Q5_1
  const u8* b = row + (size_t)g * 24;
  float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
  u32 qh = ld16(b + 4) | ((u32)ld16(b + 6) << 16);
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = b[8 + i];
    w[i] = __fadd_rn(__fmul_rn(d, (float)((v & 15) | (((qh >> i) & 1) << 4))), m);
    w[i + 16] = __fadd_rn(__fmul_rn(d, (float)((v >> 4) | (((qh >> (i + 16)) & 1) << 4))), m);
  }
}
template <> __device__ __forceinline__ void deq32<10>(const u8* __restrict__ row, int g, float* w) {  // Q2_K
  const u8* b = row + (size_t)(g >> 3) * 84;
  int s = g & 7, sh = 2 * (s & 3);
  float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
  const u8* q = b + 16 + (s >> 2) * 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    u32 sc = b[2 * s + h];
    float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
#pragma unroll
    for (int i = 0; i < 16; i++)
      w[16 * h + i] = __fsub_rn(__fmul_rn(dl, (float)((q[16 * h + i] >> sh) & 3)), ml);
  }
}
template <> __device__ __forceinline__ void deq32<11>(const u8* __restrict__ row, int g, float* w) {  // Q3_K
  const u8* b = row + (size_t)(g >> 3) * 110;
  int s = g & 7, sh = 2 * (s & 3);
  float d = h2f(ld16(b + 108));
  const u8* q = b + 32 + (s >> 2) * 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float dl = __fmul_rn(d, (float)q3k_scale(b, 2 * s + h));
#pragma unroll
    for (int i = 0; i < 16; i++) {
      int j = 16 * h + i;
      int qv = (int)((q[j] >> sh) & 3) - (((b[j] >> s) & 1) ? 0 : 4);
      w[j] = __fmul_rn(dl, (float)qv);
    }
  }
}
template <> __device__ __forceinline__ void deq32<13>(const u8* __restrict__ row, int g, float* w) {  // Q5_K
  const u8* b = row + (size_t)(g >> 3) * 176;
  int s = g & 7, sc, mn;
  k_scale_min(b + 4, s, &sc, &mn);
  float dl = __fmul_rn(h2f(ld16(b)), (float)sc), ml = __fmul_rn(h2f(ld16(b + 2)), (float)mn);
  const u8* qs = b + 48 + (s >> 1) * 32;
  int sh = (s & 1) * 4;
#pragma unroll
  for (int i = 0; i < 32; i++)
    w[i] = __fsub_rn(__fmul_rn(dl, (float)(((qs[i] >> sh) & 15) | (((b[16 + i] >> s) & 1) << 4))), ml);
}
template <> __device__ __forceinline__ void deq32<20>(const u8* __restrict__ row, int g, float* w) {  // IQ4_NL
  const u8* b = row + (size_t)g * 18;
  float d = h2f(ld16(b));
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = b[2 + i];
    w[i] = __fmul_rn(d, iq4_level(v & 15));
    w[i + 16] = __fmul_rn(d, iq4_level(v >> 4));
  }
}
template <> __device__ __forceinline__ void deq32<23>(const u8* __restrict__ row, int g, float* w) {  // IQ4_XS
  const u8* b = row + (size_t)(g >> 3) * 136;
  int s = g & 7;
  int ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15) | (((ld16(b + 2) >> (2 * s)) & 3) << 4);
  float dl = __fmul_rn(h2f(ld16(b)), (float)(ls - 32));
  const u8* q = b + 8 + s * 16;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = q[i];
    w[i] = __fmul_rn(dl, iq4_level(v & 15));
    w[i + 16] = __fmul_rn(dl, iq4_level(v >> 4));
  }
}
template <> __device__ __forceinline__ void deq32<30>(const u8* __restrict__ row, int g, float* w) {  // BF16
  const u8* b = row + (size_t)g * 64;  // a bf16 is the high half of its f32: exact
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = ld32(b + 4 * i);
    w[2 * i] = __uint_as_float(v << 16);
    w[2 * i + 1] = __uint_as_float(v & 0xffff0000u);
  }
}
template <> __device__ __forceinline__ void deq32<39>(const u8* __restrict__ row, int g, float* w) {  // MXFP4
  const u8* b = row + (size_t)g * 17;
  float d = e8m0_half(b[0]);
#pragma unroll
  for (int i = 0; i < 16; i++) {
    u32 v = b[1 + i];
    w[i] = __fmul_rn(mxfp4_level(v & 15), d);
    w[i + 16] = __fmul_rn(mxfp4_level(v >> 4), d);
  }
}
"""

DEQ4 = r"""
template <> __device__ __forceinline__ void deq4<0>(const u8* __restrict__ row, int g, int sub, float* w) {
  float4 v = *(const float4*)(row + (size_t)(g * 32 + sub * 4) * 4);
  w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
}
template <> __device__ __forceinline__ void deq4<1>(const u8* __restrict__ row, int g, int sub, float* w) {
  const u8* b = row + (size_t)(g * 32 + sub * 4) * 2;
  u32 a = ld32(b), c = ld32(b + 4);
  w[0] = h2f(a & 0xffff); w[1] = h2f(a >> 16); w[2] = h2f(c & 0xffff); w[3] = h2f(c >> 16);
}
template <> __device__ __forceinline__ void deq4<2>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_0
  const u8* b = row + (size_t)g * 18;
  float d = h2f(ld16(b));
  const u8* q = b + 2 + (sub & 3) * 4;
  u32 v = ld16(q) | ((u32)ld16(q + 2) << 16);
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(d, (float)((int)((v >> (8 * k + sh)) & 15) - 8));
}
template <> __device__ __forceinline__ void deq4<3>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_1
  const u8* b = row + (size_t)g * 20;
  float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
  u32 v = ld32(b + 4 + (sub & 3) * 4);
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fadd_rn(__fmul_rn(d, (float)((v >> (8 * k + sh)) & 15)), m);
}
template <> __device__ __forceinline__ void deq4<8>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q8_0
  const u8* b = row + (size_t)g * 34;
  float d = h2f(ld16(b));
  const u8* q = b + 2 + sub * 4;
  u32 v = ld16(q) | ((u32)ld16(q + 2) << 16);
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn((float)(signed char)((v >> (8 * k)) & 0xff), d);
}
template <> __device__ __forceinline__ void deq4<12>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_K
  const u8* b = row + (size_t)(g >> 3) * 144;
  int s = g & 7;
  float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
  const u8* S = b + 4;
  int sc, mn;
  if (s < 4) { sc = S[s] & 63; mn = S[s+4] & 63; }
  else { sc = (S[s+4] & 15) | ((S[s-4] >> 6) << 4); mn = (S[s+4] >> 4) | ((S[s] >> 6) << 4); }
  float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
  u32 v = ld32(b + 16 + (s >> 1) * 32 + sub * 4);
  int sh = (s & 1) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fsub_rn(__fmul_rn(dl, (float)((v >> (8 * k + sh)) & 15)), ml);
}
template <> __device__ __forceinline__ void deq4<14>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q6_K
  const u8* b = row + (size_t)(g >> 3) * 210;
  int s = g & 7, r = s >> 2, f = s & 3;
  const u8* ql = b + r * 64 + (f & 1) * 32 + sub * 4;
  const u8* qh = b + 128 + r * 32 + sub * 4;
  int lsh = (f >> 1) * 4;
  float dl = __fmul_rn(h2f(ld16(b + 208)), (float)(signed char)b[192 + 2 * s + (sub >> 2)]);
  u32 l = ld16(ql) | ((u32)ld16(ql + 2) << 16), h = ld16(qh) | ((u32)ld16(qh + 2) << 16);
#pragma unroll
  for (int k = 0; k < 4; k++) {
    int q = (int)(((l >> (8 * k + lsh)) & 15) | (((h >> (8 * k + 2 * f)) & 3) << 4)) - 32;
    w[k] = __fmul_rn(dl, (float)q);
  }
}
template <> __device__ __forceinline__ void deq4<6>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q5_0
  const u8* b = row + (size_t)g * 22;
  float d = h2f(ld16(b));
  u32 qh = ld16(b + 2) | ((u32)ld16(b + 4) << 16);
  const u8* q = b + 6 + (sub & 3) * 4;
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = __fmul_rn(d, (float)((int)(((q[k] >> sh) & 15) | (((qh >> (sub * 4 + k)) & 1) << 4)) - 16));
}
template <> __device__ __forceinline__ void deq4<7>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q5_1
  const u8* b = row + (size_t)g * 24;
  float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
  u32 qh = ld16(b + 4) | ((u32)ld16(b + 6) << 16);
  const u8* q = b + 8 + (sub & 3) * 4;
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = __fadd_rn(__fmul_rn(d, (float)(((q[k] >> sh) & 15) | (((qh >> (sub * 4 + k)) & 1) << 4))), m);
}
template <> __device__ __forceinline__ void deq4<10>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q2_K
  const u8* b = row + (size_t)(g >> 3) * 84;
  int s = g & 7, sh = 2 * (s & 3);
  u32 sc = b[2 * s + (sub >> 2)];
  float dl = __fmul_rn(h2f(ld16(b + 80)), (float)(sc & 15));
  float ml = __fmul_rn(h2f(ld16(b + 82)), (float)(sc >> 4));
  const u8* q = b + 16 + (s >> 2) * 32 + sub * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fsub_rn(__fmul_rn(dl, (float)((q[k] >> sh) & 3)), ml);
}
template <> __device__ __forceinline__ void deq4<11>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q3_K
  const u8* b = row + (size_t)(g >> 3) * 110;
  int s = g & 7, sh = 2 * (s & 3);
  float dl = __fmul_rn(h2f(ld16(b + 108)), (float)q3k_scale(b, 2 * s + (sub >> 2)));
  const u8* q = b + 32 + (s >> 2) * 32 + sub * 4;
  const u8* hm = b + sub * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    int qv = (int)((q[k] >> sh) & 3) - (((hm[k] >> s) & 1) ? 0 : 4);
    w[k] = __fmul_rn(dl, (float)qv);
  }
}
template <> __device__ __forceinline__ void deq4<13>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q5_K
  const u8* b = row + (size_t)(g >> 3) * 176;
  int s = g & 7, sc, mn;
  k_scale_min(b + 4, s, &sc, &mn);
  float dl = __fmul_rn(h2f(ld16(b)), (float)sc), ml = __fmul_rn(h2f(ld16(b + 2)), (float)mn);
  u32 v = ld32(b + 48 + (s >> 1) * 32 + sub * 4), h = ld32(b + 16 + sub * 4);
  int sh = (s & 1) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = __fsub_rn(__fmul_rn(dl, (float)(((v >> (8 * k + sh)) & 15) | (((h >> (8 * k + s)) & 1) << 4))), ml);
}
template <> __device__ __forceinline__ void deq4<20>(const u8* __restrict__ row, int g, int sub, float* w) {  // IQ4_NL
  const u8* b = row + (size_t)g * 18;
  float d = h2f(ld16(b));
  const u8* q = b + 2 + (sub & 3) * 4;
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(d, iq4_level((q[k] >> sh) & 15));
}
template <> __device__ __forceinline__ void deq4<23>(const u8* __restrict__ row, int g, int sub, float* w) {  // IQ4_XS
  const u8* b = row + (size_t)(g >> 3) * 136;
  int s = g & 7;
  int ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15) | (((ld16(b + 2) >> (2 * s)) & 3) << 4);
  float dl = __fmul_rn(h2f(ld16(b)), (float)(ls - 32));
  const u8* q = b + 8 + s * 16 + (sub & 3) * 4;
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(dl, iq4_level((q[k] >> sh) & 15));
}
template <> __device__ __forceinline__ void deq4<30>(const u8* __restrict__ row, int g, int sub, float* w) {  // BF16
  const u8* b = row + (size_t)(g * 32 + sub * 4) * 2;
  u32 a = ld32(b), c = ld32(b + 4);
  w[0] = __uint_as_float(a << 16); w[1] = __uint_as_float(a & 0xffff0000u);
  w[2] = __uint_as_float(c << 16); w[3] = __uint_as_float(c & 0xffff0000u);
}
template <> __device__ __forceinline__ void deq4<39>(const u8* __restrict__ row, int g, int sub, float* w) {  // MXFP4
  const u8* b = row + (size_t)g * 17;
  float d = e8m0_half(b[0]);
  const u8* q = b + 1 + (sub & 3) * 4;
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(mxfp4_level((q[k] >> sh) & 15), d);
}
"""
