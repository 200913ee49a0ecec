// Multi-head latent attention's own steps (DeepSeek V2/V3; runtime/arch/mla.py), a thread an
// output element: the latent's RMS norm in each cached row [latent, k_pe], the queries
// with K_b absorbed ([q_nope K_b[head], q_pe]), and each head's values out of its
// attention-weighted latent (V_b).

struct Params {
    n: u32,  // rows
    heads: u32,
    rank: u32,  // the latent's width
    nope: u32,  // each head's query part without RoPE
    rope: u32,  // ... with it (the cached row's tail)
    v_dim: u32,
    gxs: u32,  // threads along x (indices past it go on in y)
    eps: f32,
}

@group(0) @binding(0) var<storage, read> xa: array<f32>;
@group(0) @binding(1) var<storage, read> wv: array<f32>;
@group(0) @binding(2) var<storage, read_write> outs: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> red: array<f32, 64>;

// a workgroup a row of outs (n, rank + rope): its first rank values RMS-normed times wv
@compute @workgroup_size(64)
fn mla_kv_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gxs;
    let valid = row < p.n;
    let rb = row * (p.rank + p.rope);
    var s = 0.0;
    if (valid) {
        for (var i = li; i < p.rank; i += 64u) {
            let v = outs[rb + i];
            s += v * v;
        }
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] += red[li + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.rank) + p.eps);
    if (valid) {
        for (var i = li; i < p.rank; i += 64u) {
            outs[rb + i] = outs[rb + i] * scale * wv[i];
        }
    }
}

// outs (n, heads, rank + rope): [q_nope K_b[head]^T, q_pe] of xa (n, heads, nope + rope),
// wv = K_b (heads, rank, nope)
@compute @workgroup_size(64)
fn mla_absorb(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    let w = p.rank + p.rope;
    if (i >= p.n * p.heads * w) {
        return;
    }
    let rh = i / w;  // (row, head)
    let c = i % w;
    let h = rh % p.heads;
    let qb = rh * (p.nope + p.rope);
    if (c >= p.rank) {
        outs[i] = xa[qb + p.nope + c - p.rank];
        return;
    }
    var s = 0.0;
    let kb = (h * p.rank + c) * p.nope;
    for (var j = 0u; j < p.nope; j++) {
        s += xa[qb + j] * wv[kb + j];
    }
    outs[i] = s;
}

// outs (n, heads, v_dim): each head's attention-weighted latent xa (n, heads, rank + rope;
// its first rank values) times V_b[head]^T, wv = V_b (heads, v_dim, rank)
@compute @workgroup_size(64)
fn mla_values(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.heads * p.v_dim) {
        return;
    }
    let rh = i / p.v_dim;
    let v = i % p.v_dim;
    let h = rh % p.heads;
    let ob = rh * (p.rank + p.rope);
    let vb = (h * p.v_dim + v) * p.rank;
    var s = 0.0;
    for (var r = 0u; r < p.rank; r++) {
        s += xa[ob + r] * wv[vb + r];
    }
    outs[i] = s;
}
