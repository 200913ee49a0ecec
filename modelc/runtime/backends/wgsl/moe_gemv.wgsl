// A mixture's experts: for each (token, slot) pair p and each output row of an expert,
// dot(dequant(W[ids[p] * per_expert + row]), x[p / x_div]) into outs[p][col0 + row]: the
// chosen experts' products of every pair in one dispatch a weight buffer (gemv.wgsl's
// threads along a row, one row of x; a workgroup whose rows are not in this buffer leaves).
// Templated as gemv.wgsl (webgpu.py's moe_gemv_source): DEQ4, WG, QPT, TPR.
// moe_gemv_grouped: a workgroup an expert's rows (z: the expert), over that expert's pairs
// (moe_group.wgsl's offs / plist): each expert's rows read once a step, not once a pair;
// each pair's sums the same as moe_gemv's.

struct Params {
    rows: u32,  // weight rows in this buffer (the experts' stack may be split)
    cols: u32,  // in_features
    pairs: u32,  // (token, slot) pairs
    row_bytes: u32,
    out_stride: u32,  // outs' row width
    col0: u32,  // the first column written
    gxs: u32,  // workgroups along x (rows past it go on in y)
    r0: u32,  // the stack's row at this buffer's first
    per_expert: u32,  // rows an expert (its out_features)
    x_div: u32,  // pair p reads x row p / x_div (the slots a token: its hidden state)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;  // rows padded to whole quads
@group(0) @binding(2) var<storage, read_write> outs: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> ids: array<u32>;  // each pair's expert
@group(0) @binding(5) var<storage, read> offs: array<u32>;  // grouped: expert e's pairs are
@group(0) @binding(6) var<storage, read> plist: array<u32>;  // plist[offs[e] .. offs[e + 1]]

const WG: u32 = 64u;
const QPT: u32 = 8u;
const TPR: u32 = 64u;  // threads a weight row (a power of two dividing WG)
const RPW: u32 = WG / TPR;  // weight rows a workgroup

var<workgroup> part: array<f32, WG>;

// thread lid's share of pair `pair`'s row (rb: its bytes in wt; quads 0: not live), summed
// over the workgroup's threads of the row, into outs (t 0, live)
fn pair_row(pair: u32, lid: u32, row: u32, rb: u32, quads: u32, live: bool) {
    let t = lid % TPR;
    let xq = (pair / p.x_div) * ((p.cols + 3u) / 4u);
    var a = 0.0;
    for (var c = t * QPT; c < quads; c += TPR * QPT) {
        for (var j = 0u; j < QPT; j++) {
            let k = c + j;
            a += dot(DEQ4(rb, k, p.cols), xs[xq + k]);
        }
    }
    part[lid] = a;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            part[lid] += part[lid + s];
        }
        workgroupBarrier();
    }
    if (t == 0u && live) {
        outs[pair * p.out_stride + p.col0 + row] = part[lid];
    }
}

@compute @workgroup_size(WG)
fn moe_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * p.gxs) * RPW;
    let pair = wid.z;
    let g0 = ids[pair] * p.per_expert + first;  // the stack's row of the workgroup's first
    if (first >= p.per_expert || g0 + RPW <= p.r0 || g0 >= p.r0 + p.rows) {
        return;  // the whole workgroup (uniform): no barrier is left waiting
    }
    let row = first + lid / TPR;
    let g = g0 + lid / TPR;
    let live = row < p.per_expert && g >= p.r0 && g < p.r0 + p.rows;
    let rb = select(0u, (g - p.r0) * p.row_bytes, live);
    pair_row(pair, lid, row, rb, select(0u, (p.cols + 3u) / 4u, live), live);
}

@compute @workgroup_size(WG)
fn moe_gemv_grouped(
    @builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
) {
    let first = (wid.x + wid.y * p.gxs) * RPW;
    let e = wid.z;
    let g0 = e * p.per_expert + first;
    let lo = offs[e];
    let hi = offs[e + 1u];
    if (first >= p.per_expert || g0 + RPW <= p.r0 || g0 >= p.r0 + p.rows || lo >= hi) {
        return;  // uniform across the workgroup
    }
    let row = first + lid / TPR;
    let g = g0 + lid / TPR;
    let live = row < p.per_expert && g >= p.r0 && g < p.r0 + p.rows;
    let rb = select(0u, (g - p.r0) * p.row_bytes, live);
    let quads = select(0u, (p.cols + 3u) / 4u, live);
    for (var i = lo; i < hi; i++) {
        pair_row(plist[i], lid, row, rb, quads, live);
        workgroupBarrier();  // part is the next pair's
    }
}
