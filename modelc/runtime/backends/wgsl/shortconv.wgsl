// LFM2's short convolution in the resident WebGPU step (webgpu_conv.py; the CPU's
// runtime/arch/shortconv.py): with bcx = h Win (n, 3d: the B, C and x rows),
//   shortconv_bx:  bx = B * x                                         (n, d)
//   shortconv:     y[t] = C[t] * sum_j kernel[:, j] * in[t - (L-1) + j]  (n, d)
// where in[u] is the sequence's bx row u of this step, or for u < 0 its state's row
// L-1+u (the last L-1 inputs of its earlier steps, written by the host before the step).
// Each row's sequence and its index in it: rows[2 r], rows[2 r + 1].

struct Params {
    n: u32,  // rows
    d: u32,  // channels
    width: u32,  // L, the kernel's width
    gxs: u32,  // threads along x (indices past it go on in y)
}

@group(0) @binding(0) var<storage, read> bcx: array<f32>;  // (n, 3d)
@group(0) @binding(1) var<storage, read_write> bx: array<f32>;  // (n, d)
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> kernel: array<f32>;  // (d, L)
@group(0) @binding(4) var<storage, read> state: array<f32>;  // (sequences, L-1, d)
@group(0) @binding(5) var<storage, read> rows: array<u32>;  // (n, 2): sequence, index
@group(0) @binding(6) var<storage, read_write> y: array<f32>;  // (n, d)

@compute @workgroup_size(64)
fn shortconv_bx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.d) {
        return;
    }
    let r = i / p.d;
    let c = i % p.d;
    bx[i] = bcx[r * 3u * p.d + c] * bcx[r * 3u * p.d + 2u * p.d + c];
}

@compute @workgroup_size(64)
fn shortconv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.d) {
        return;
    }
    let r = i / p.d;
    let c = i % p.d;
    let s = rows[2u * r];
    let t = rows[2u * r + 1u];
    let keep = p.width - 1u;
    var acc = 0.0;
    for (var j = 0u; j < p.width; j++) {
        let u = t + j;  // in x = [state; bx]: row t + j
        var v = 0.0;
        if (u < keep) {
            v = state[(s * keep + u) * p.d + c];
        } else {
            v = bx[(r - t + u - keep) * p.d + c];
        }
        acc = acc + v * kernel[c * p.width + j];
    }
    y[i] = acc * bcx[r * 3u * p.d + p.d + c];
}
