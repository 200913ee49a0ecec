// x @ dequant(W).T for few rows of x (decode): TPR threads a weight row (RPW rows a
// workgroup), striding over the row's chunks of QPT quads (thread t: chunks t, t + TPR,
// ...), so neighbouring threads read neighbouring bytes of one row; each thread sums its part for
// the NX rows of x, then the parts meet in workgroup memory (a tree of halvings).
// Templated as matmul.wgsl (webgpu.py's gemv_source): the type's deq4_* of quants.wgsl, NX
// (rows of x), WG (threads), QPT (quads a chunk: a whole block, or one quad of F32/F16/BF16),
// TPR (threads a row), and the accumulators' declarations, steps and parts as scalars.

struct Params {
    rows: u32,  // weight rows in this buffer (a weight over the binding limit is split)
    cols: u32,  // in_features
    n: u32,  // rows of x
    row_bytes: u32,
    out_stride: u32,  // out_features of the whole weight (or the output's row width)
    row0: u32,  // the first output column this buffer's rows write
    gxs: u32,  // workgroups along x (rows past it go on in y)
    acc: u32,  // 1 adds the product to what out holds (a residual), 0 writes it
}

@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;  // rows padded to whole quads
@group(0) @binding(2) var<storage, read_write> outs: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const NX: u32 = 8u;
const WG: u32 = 64u;
const QPT: u32 = 8u;
const TPR: u32 = 64u;  // threads a weight row (a power of two dividing WG)
const RPW: u32 = WG / TPR;  // weight rows a workgroup

var<workgroup> part: array<f32, NX * WG>;  // x row r's part of thread i at r * WG + i

@compute @workgroup_size(WG)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * p.gxs) * RPW;
    if (first >= p.rows) {
        return;  // the whole workgroup (uniform): no barrier is left waiting
    }
    let t = lid % TPR;  // this thread's place along its row
    let row = first + lid / TPR;
    let live = row < p.rows;
    let x0 = wid.z * NX;
    let rb = row * p.row_bytes;
    let quads = select(0u, (p.cols + 3u) / 4u, live);  // whole chunks (QPT divides a block)
    var xq: array<u32, NX>;  // x rows x0 .. x0+NX (rows past n repeat the last one)
    for (var r = 0u; r < NX; r++) {
        xq[r] = min(x0 + r, p.n - 1u) * ((p.cols + 3u) / 4u);
    }
    ACC_DECL
    for (var c = t * QPT; c < quads; c += TPR * QPT) {
        for (var j = 0u; j < QPT; j++) {
            let k = c + j;
            let w = DEQ4(rb, k, p.cols);
            ACC_STEP
        }
    }
    ACC_PART
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            for (var r = 0u; r < NX; r++) {
                part[r * WG + lid] += part[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    for (var r = t; r < NX; r += TPR) {  // thread t of a row writes x rows x0 + t, + TPR, ..
        if (live && x0 + r < p.n) {
            let v = part[r * WG + lid - t];
            let o = (x0 + r) * p.out_stride + p.row0 + row;
            outs[o] = select(v, outs[o] + v, p.acc != 0u);
        }
    }
}
