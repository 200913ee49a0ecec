// RoPE: the cos/sin table of positions x inverse frequencies, and the rotation itself.

struct Params {
    n: u32,  // rows (positions)
    heads: u32,
    hd: u32,
    hn: u32,  // rot_dim / 2: pairs rotated per head
    neox: u32,  // 1: rotate halves (NeoX); 0: adjacent pairs (GGUF NORM)
    gxs: u32,  // threads along x (indices past it go on in y)
    heads2: u32,  // rope: heads of a second block rotated by the same dispatch (0: none);
                  // rope_angles: a factor on cos and sin, its f32 bits (0: none; YaRN's or
                  // LongRoPE's where only part of a head rotates)
    off2: u32,  // ... its first element in xs (the resident decoder's keys after its queries)
}

@group(0) @binding(0) var<storage, read> pos: array<i32>;
@group(0) @binding(1) var<storage, read> inv: array<f32>;
@group(0) @binding(2) var<storage, read_write> cs: array<f32>;  // (n, hn)
@group(0) @binding(3) var<storage, read_write> sn: array<f32>;  // (n, hn)
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read_write> xs: array<f32>;  // (n, heads, hd), in place

// sin and cos of a float32 angle to about one ulp: Cody-Waite reduction by pi/2 in three
// parts and the minimax polynomials of Cephes' sinf/cosf (a GPU's own sin/cos only promise
// an absolute error of 2^-11 on [-pi, pi], and nothing past it; positions reach thousands
// of radians).
fn sincos(x: f32) -> vec2<f32> {
    let ax = abs(x);
    var j = u32(floor(ax * 1.27323954473516));  // 4 / pi
    j += j & 1u;
    let y = f32(j);
    let z = ((ax - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    let zz = z * z;
    let pc = 1.0 - 0.5 * zz
        + zz * zz * ((2.443315711809948e-5 * zz - 1.388731625493765e-3) * zz + 4.166664568298827e-2);
    let ps = z + z * zz * ((-1.9515295891e-4 * zz + 8.3321608736e-3) * zz - 1.6666654611e-1);
    let q = j & 7u;
    let swap = q == 2u || q == 6u;  // quadrants where sin and cos trade polynomials
    var s = select(ps, pc, swap);
    var c = select(pc, ps, swap);
    if (q >= 4u) {
        s = -s;
    }
    if (q == 2u || q == 4u) {
        c = -c;
    }
    if (x < 0.0) {
        s = -s;
    }
    return vec2<f32>(s, c);
}

@compute @workgroup_size(64)
fn rope_angles(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.hn) {
        return;
    }
    let theta = f32(pos[i / p.hn]) * inv[i % p.hn];
    let v = sincos(theta);
    let f = select(bitcast<f32>(p.heads2), 1.0, p.heads2 == 0u);
    cs[i] = v.y * f;
    sn[i] = v.x * f;
}

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>) {
    var i = gid.x + gid.y * p.gxs;  // (row, head, pair), then those of the second block
    var heads = p.heads;
    var off = 0u;
    let first = p.n * p.heads * p.hn;
    if (i >= first) {
        i -= first;
        heads = p.heads2;
        off = p.off2;
    }
    if (i >= p.n * heads * p.hn) {
        return;
    }
    let k = i % p.hn;
    let rh = i / p.hn;
    let row = rh / heads;
    let base = off + rh * p.hd;
    let ia = select(base + 2u * k, base + k, p.neox != 0u);
    let ib = select(base + 2u * k + 1u, base + k + p.hn, p.neox != 0u);
    let c = cs[row * p.hn + k];
    let s = sn[row * p.hn + k];
    let a = xs[ia];
    let b = xs[ib];
    xs[ia] = a * c - b * s;
    xs[ib] = a * s + b * c;
}
