// GGML block dequantization, read straight from the raw row bytes of a weight.
//
// Appended after half.wgsl by a module that declares `wt: array<u32>` (the weight's bytes,
// little-endian words).  Every `deq4_*(rb, k, cols)` returns weights 4k .. 4k+3 of the row
// starting at byte rb, as a vec4 (registers: no private arrays, which a software Vulkan
// keeps in memory); `cols` only bounds F32/F16/BF16 rows (0 past the row's end).  Layouts
// and arithmetic follow modelc/formats/quants.py (the numpy reference).

fn ld_u8(off: u32) -> u32 {
    return (wt[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

// four bytes starting at any byte offset, as one little-endian word
fn ld_u32(off: u32) -> u32 {
    let i = off >> 2u;
    let s = (off & 3u) * 8u;
    if (s == 0u) {
        return wt[i];
    }
    return (wt[i] >> s) | (wt[i + 1u] << (32u - s));
}

// the f16 at an even byte offset
fn ld_f16(off: u32) -> f32 {
    let w = wt[off >> 2u];
    return half_to_f32(select(w & 0xffffu, w >> 16u, (off & 2u) != 0u));
}

// the four bytes of a word, each shifted right by sh and masked
fn bytes4(w: u32, sh: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) >> vec4<u32>(sh)) & vec4<u32>(mask);
}

// the four bytes of a word as signed int8 values
fn sbytes4(w: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(w << 24u, w << 16u, w << 8u, w)) >> vec4<u32>(24u);
    return vec4<f32>(v);
}

fn deq4_f32(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let e = 4u * k;
    let b = (rb >> 2u) + e;
    if (e + 3u < cols) {
        return vec4<f32>(
            bitcast<f32>(wt[b]), bitcast<f32>(wt[b + 1u]),
            bitcast<f32>(wt[b + 2u]), bitcast<f32>(wt[b + 3u]),
        );
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (e + j < cols) {
            v[j] = bitcast<f32>(wt[b + j]);
        }
    }
    return v;
}

fn deq4_f16(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let e = 4u * k;
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (e + j < cols) {
            v[j] = ld_f16(rb + 2u * (e + j));
        }
    }
    return v;
}

fn deq4_bf16(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let e = 4u * k;
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (e + j < cols) {
            let off = rb + 2u * (e + j);
            let w = wt[off >> 2u];
            v[j] = bitcast<f32>(select(w << 16u, w & 0xffff0000u, (off & 2u) != 0u));
        }
    }
    return v;
}

// Q4_0: d:f16, qs[16]; x = d * (nibble - 8); low nibbles weights 0..15, high 16..31
fn deq4_q4_0(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 18u;
    let i = k & 7u;
    let q = bytes4(ld_u32(base + 2u + 4u * (i & 3u)), (i >> 2u) * 4u, 15u);
    return ld_f16(base) * (vec4<f32>(q) - 8.0);
}

// Q4_1: d:f16, m:f16, qs[16]; x = d * nibble + m
fn deq4_q4_1(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 20u;
    let i = k & 7u;
    let q = bytes4(ld_u32(base + 4u + 4u * (i & 3u)), (i >> 2u) * 4u, 15u);
    return ld_f16(base) * vec4<f32>(q) + ld_f16(base + 2u);
}

// the 5-bit values of weights 4i..4i+3 of a Q5 block: nibbles at qs, high bits in qh
fn q5_vals(qs: u32, qh: u32, i: u32) -> vec4<u32> {
    let lo = bytes4(ld_u32(qs + 4u * (i & 3u)), (i >> 2u) * 4u, 15u);
    let hi = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(4u * i))) & vec4<u32>(1u);
    return lo | (hi << vec4<u32>(4u));
}

// Q5_0: d:f16, qh[4], qs[16]; x = d * ((nibble | hbit << 4) - 16)
fn deq4_q5_0(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 22u;
    let q = q5_vals(base + 6u, ld_u32(base + 2u), k & 7u);
    return ld_f16(base) * (vec4<f32>(q) - 16.0);
}

// Q5_1: d:f16, m:f16, qh[4], qs[16]; x = d * (nibble | hbit << 4) + m
fn deq4_q5_1(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 24u;
    let q = q5_vals(base + 8u, ld_u32(base + 4u), k & 7u);
    return ld_f16(base) * vec4<f32>(q) + ld_f16(base + 2u);
}

// Q8_0: d:f16, qs[32] int8; x = q * d
fn deq4_q8_0(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 34u;
    return sbytes4(ld_u32(base + 2u + 4u * (k & 7u))) * ld_f16(base);
}

// Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 bytes at s
fn k_scale_min(s: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(ld_u8(s + j) & 63u, ld_u8(s + 4u + j) & 63u);
    }
    let md = ld_u8(s + 4u + j);
    let sc = (md & 15u) | ((ld_u8(s + j - 4u) >> 2u) & 0x30u);
    let mn = (md >> 4u) | ((ld_u8(s + j) >> 2u) & 0x30u);
    return vec2<u32>(sc, mn);
}

// Q4_K: d, dmin, scales[12], qs[128] (4 runs of 32 bytes: sub-block 2r low nibbles, 2r+1 high)
fn deq4_q4_k(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 6u) * 144u;
    let e0 = (k & 63u) * 4u;  // first weight in the superblock
    let j = e0 >> 5u;
    let sm = k_scale_min(base + 4u, j);
    let q = bytes4(ld_u32(base + 16u + (j >> 1u) * 32u + (e0 & 31u)), (j & 1u) * 4u, 15u);
    return ld_f16(base) * f32(sm.x) * vec4<f32>(q) - ld_f16(base + 2u) * f32(sm.y);
}

// Q5_K: as Q4_K with qh[32] (bit j of byte i: high bit of weight i of sub-block j) before qs
fn deq4_q5_k(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 6u) * 176u;
    let e0 = (k & 63u) * 4u;
    let j = e0 >> 5u;
    let sm = k_scale_min(base + 4u, j);
    let lo = bytes4(ld_u32(base + 48u + (j >> 1u) * 32u + (e0 & 31u)), (j & 1u) * 4u, 15u);
    let hi = bytes4(ld_u32(base + 16u + (e0 & 31u)), j, 1u);
    let q = lo | (hi << vec4<u32>(4u));
    return ld_f16(base) * f32(sm.x) * vec4<f32>(q) - ld_f16(base + 2u) * f32(sm.y);
}

// Q6_K: ql[128], qh[64], scales[16] int8, d; 16 sub-blocks of 16 weights.  Per run of 128
// weights: ql[64] low nibbles then high nibbles, qh[32] four 2-bit fields
fn deq4_q6_k(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 6u) * 210u;
    let e0 = (k & 63u) * 4u;
    let rn = e0 >> 7u;
    let within = e0 & 127u;
    let lo = bytes4(ld_u32(base + rn * 64u + (within & 63u)), (within >> 6u) * 4u, 15u);
    let hi = bytes4(ld_u32(base + 128u + rn * 32u + (within & 31u)), (within >> 5u) * 2u, 3u);
    let q = vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32));
    let sc = f32(i32(ld_u8(base + 192u + (e0 >> 4u)) << 24u) >> 24u);
    return ld_f16(base + 208u) * sc * q;
}

var<private> IQ4_KVALUES: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// IQ4_NL: d:f16, qs[16]; x = d * KVALUES[nibble]
fn deq4_iq4_nl(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 18u;
    let i = k & 7u;
    let q = bytes4(ld_u32(base + 2u + 4u * (i & 3u)), (i >> 2u) * 4u, 15u);
    let v = vec4<f32>(IQ4_KVALUES[q.x], IQ4_KVALUES[q.y], IQ4_KVALUES[q.z], IQ4_KVALUES[q.w]);
    return ld_f16(base) * v;
}

var<private> MXFP4_KVALUES: array<f32, 16> = array<f32, 16>(
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
);

// MXFP4 (gpt-oss's experts): e:E8M0, qs[16]; x = MXFP4_KVALUES[nibble] * 2^(e - 128) (the
// E2M1 values doubled, the scale halved: ggml's kvalues_mxfp4 and E8M0_TO_FP32_HALF)
fn deq4_mxfp4(rb: u32, k: u32, cols: u32) -> vec4<f32> {
    let base = rb + (k >> 3u) * 17u;
    let i = k & 7u;
    let q = bytes4(ld_u32(base + 1u + 4u * (i & 3u)), (i >> 2u) * 4u, 15u);
    let e = ld_u8(base);
    let bits = select((e - 1u) << 23u, 0x00200000u << e, e < 2u);
    let v = vec4<f32>(MXFP4_KVALUES[q.x], MXFP4_KVALUES[q.y], MXFP4_KVALUES[q.z], MXFP4_KVALUES[q.w]);
    return bitcast<f32>(bits) * v;
}
