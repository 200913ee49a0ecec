// A step's new keys and values into one sequence's cache layer (the device-resident
// decoder, webgpu_llama.py): rows row0 .. row0+rows-1 of k and v (rows of `width` floats)
// to positions pos0 .. of the layer's K (from k_off) and V (from v_off), as float32 or as
// float16 rounded to nearest even (numpy's astype, what the CPU's f16 cache stores).  One
// thread per pair of elements (width is even).

struct Params {
    row0: u32,
    rows: u32,
    pos0: u32,
    width: u32,  // n_head_kv * head_dim
    k_off: u32,  // elements before position 0's keys in the bound cache layer
    v_off: u32,  // ... before its values
    f16: u32,
    gxs: u32,  // threads along x (indices past it go on in y)
}

@group(0) @binding(0) var<storage, read> kn: array<f32>;
@group(0) @binding(1) var<storage, read> vn: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

// f32 -> IEEE half bits, rounded to nearest even (subnormals, overflow to inf, NaN kept)
fn f32_to_half(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x47800000u) {  // 65536 and over: inf, or NaN
        return select(sign | 0x7c00u, sign | 0x7e00u, a > 0x7f800000u);
    }
    if (a >= 0x38800000u) {  // a normal half (2^-14 and over)
        let v = a - 0x38000000u;
        return sign | ((v + 0xfffu + ((v >> 13u) & 1u)) >> 13u);
    }
    return sign | u32(round(abs(f) * 16777216.0));  // subnormal: m * 2^-24, ties to even
}

@compute @workgroup_size(64)
fn kv_store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (2u * i >= p.rows * p.width) {
        return;
    }
    let e = 2u * i;
    let r = e / p.width;
    let c = e % p.width;
    let src = (p.row0 + r) * p.width + c;
    let dst = (p.pos0 + r) * p.width + c;
    if (p.f16 != 0u) {
        cache[(p.k_off + dst) >> 1u] = f32_to_half(kn[src]) | (f32_to_half(kn[src + 1u]) << 16u);
        cache[(p.v_off + dst) >> 1u] = f32_to_half(vn[src]) | (f32_to_half(vn[src + 1u]) << 16u);
    } else {
        cache[p.k_off + dst] = bitcast<u32>(kn[src]);
        cache[p.k_off + dst + 1u] = bitcast<u32>(kn[src + 1u]);
        cache[p.v_off + dst] = bitcast<u32>(vn[src]);
        cache[p.v_off + dst + 1u] = bitcast<u32>(vn[src + 1u]);
    }
}
