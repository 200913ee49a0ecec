// Causal attention, one workgroup per (query row, head): scores, softmax and the weighted
// sum of values over the row's visible cache positions.  K and V are float32, or float16
// read as is (two to a u32 word); half.wgsl is prepended.  Scores may be soft-capped
// (gemma2: cap * tanh(s / cap)) and a head may have a sink (gpt-oss: a logit in the
// softmax's denominator with no value).

struct Params {
    row0: u32,  // the first query row of this dispatch
    n_head: u32,
    n_head_kv: u32,
    hd: u32,
    f16: u32,  // K and V are float16
    sstride: u32,  // scores per (row, head) in the scratch buffer
    has_sinks: u32,  // sinks (binding 7) hold each head's sink logit
    scale: f32,
    softcap: f32,  // > 0: scores capped
    k_off: u32,  // elements of kk before position 0's keys (a cache layer's place)
    v_off: u32,  // ... of vv before its values
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;  // (rows, n_head, hd)
@group(0) @binding(1) var<storage, read> kk: array<u32>;  // (kv rows, n_head_kv, hd)
@group(0) @binding(2) var<storage, read> vv: array<u32>;
@group(0) @binding(3) var<storage, read_write> outs: array<f32>;  // (rows, n_head, hd)
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> rowinfo: array<u32>;  // per row: first kv row, visible
@group(0) @binding(6) var<storage, read_write> sc: array<f32>;  // scores scratch
@group(0) @binding(7) var<storage, read> sinks: array<f32>;  // (n_head), or a dummy word

var<workgroup> red: array<f32, 64>;

fn ldk(j: u32) -> f32 {
    let i = j + p.k_off;
    if (p.f16 != 0u) {
        return half_to_f32((kk[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    return bitcast<f32>(kk[i]);
}

fn ldv(j: u32) -> f32 {
    let i = j + p.v_off;
    if (p.f16 != 0u) {
        return half_to_f32((vv[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    return bitcast<f32>(vv[i]);
}

fn reduce_max(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = p.row0 + wid.x;
    let h = wid.y;
    let kh = h / (p.n_head / p.n_head_kv);
    let kbase = rowinfo[2u * r];
    let nvis = rowinfo[2u * r + 1u];
    let qb = (r * p.n_head + h) * p.hd;
    let sb = (wid.x * p.n_head + h) * p.sstride;
    var m = -3.4028234e38;
    for (var t = li; t < nvis; t += 64u) {
        let kb = ((kbase + t) * p.n_head_kv + kh) * p.hd;
        var s = 0.0;
        for (var d = 0u; d < p.hd; d++) {
            s += q[qb + d] * ldk(kb + d);
        }
        s = s * p.scale;
        if (p.softcap > 0.0) {
            s = tanh(s / p.softcap) * p.softcap;
        }
        sc[sb + t] = s;
        m = max(m, s);
    }
    var mx = reduce_max(li, m);
    if (p.has_sinks != 0u) {
        mx = max(mx, sinks[h]);
    }
    var l = 0.0;
    for (var t = li; t < nvis; t += 64u) {
        let e = exp(sc[sb + t] - mx);
        sc[sb + t] = e;
        l += e;
    }
    var total = reduce_sum(li, l);
    if (p.has_sinks != 0u) {
        total += exp(sinks[h] - mx);
    }
    storageBarrier();
    for (var d = li; d < p.hd; d += 64u) {
        var a = 0.0;
        for (var t = 0u; t < nvis; t++) {
            a += sc[sb + t] * ldv(((kbase + t) * p.n_head_kv + kh) * p.hd + d);
        }
        outs[qb + d] = a / total;
    }
}
