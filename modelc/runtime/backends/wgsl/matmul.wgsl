// x @ dequant(W).T straight from the weight's blocks, and embedding rows (get_rows).
// `DEQ4` is replaced by the weight type's deq4_* function of quants.wgsl (appended), and
// NX (rows of x per thread) by 1 for single rows or 8.

struct Params {
    rows: u32,  // weight rows in this buffer (a weight over the binding limit is split)
    cols: u32,  // in_features
    n: u32,  // rows of x (matmul) or ids (get_rows)
    row_bytes: u32,
    out_stride: u32,  // matmul: out_features of the whole weight
    row0: u32,  // the first weight row this buffer holds
    gxs: u32,  // threads along x (indices past it go on in y)
    acc: u32,  // matmul: 1 adds the product to what out holds (a residual), 0 writes it
}

@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;  // rows padded to whole quads
@group(0) @binding(2) var<storage, read_write> outs: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> ids: array<u32>;

const NX: u32 = 8u;

// One thread per weight row and tile of NX rows of x (each dequantized quad of weights
// serves the whole tile): no shared memory, no barriers, loops of constant length.
@compute @workgroup_size(64)
fn matmul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * p.gxs;
    if (row >= p.rows) {
        return;
    }
    let x0 = gid.z * NX;
    let rb = row * p.row_bytes;
    let quads = (p.cols + 3u) / 4u;
    // x rows x0 .. x0+NX (rows past n repeat the last one, and are not written)
    var xq: array<u32, NX>;
    for (var r = 0u; r < NX; r++) {
        xq[r] = min(x0 + r, p.n - 1u) * quads;
    }
    ACC_DECL
    for (var k = 0u; k < quads; k++) {
        let w = DEQ4(rb, k, p.cols);
        ACC_STEP
    }
    ACC_STORE
}

// out[i, :] = dequant(W[ids[i], :]) for the ids this buffer's rows hold; one thread per quad
@compute @workgroup_size(64)
fn get_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let quads = (p.cols + 3u) / 4u;
    let k = gid.x;
    let i = gid.y + gid.z * 65535u;
    if (k >= quads || i >= p.n) {
        return;
    }
    let r = ids[i];
    if (r < p.row0 || r >= p.row0 + p.rows) {
        return;
    }
    let w = DEQ4((r - p.row0) * p.row_bytes, k, p.cols);
    let ob = i * p.cols + 4u * k;
    for (var j = 0u; j < 4u; j++) {
        if (4u * k + j < p.cols) {
            outs[ob + j] = w[j];
        }
    }
}
