// Row-wise reductions, one workgroup per row: RMS norm, layer norm, softmax.

struct Params {
    n: u32,  // rows
    d: u32,  // row width
    gx: u32,  // workgroups along x (rows past it go on in y)
    eps: f32,
}

@group(0) @binding(0) var<storage, read> xs: array<f32>;
@group(0) @binding(1) var<storage, read> wv: array<f32>;
@group(0) @binding(2) var<storage, read> bv: array<f32>;
@group(0) @binding(3) var<storage, read_write> outs: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> sel: array<u32>;  // rms_norm_rows: the rows of xs

var<workgroup> red: array<f32, 64>;

fn reduce(li: u32, v: f32, is_max: bool) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] = select(red[li] + red[li + s], max(red[li], red[li + s]), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// 1 / rms of the row of xs at rb (every invocation of the workgroup calls it)
fn xs_inv_rms(li: u32, rb: u32, valid: bool) -> f32 {
    var s = 0.0;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            let v = xs[rb + i];
            s += v * v;
        }
    }
    let ms = reduce(li, s, false) / f32(p.d);
    return 1.0 / sqrt(ms + p.eps);
}

@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    let rb = row * p.d;
    let scale = xs_inv_rms(li, rb, valid);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[rb + i] = xs[rb + i] * scale * wv[i];
        }
    }
}

// rms_norm of each row of outs in place (per-head Q/K norms: rows of one head's width)
@compute @workgroup_size(64)
fn rms_norm_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    let rb = row * p.d;
    var s = 0.0;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            let v = outs[rb + i];
            s += v * v;
        }
    }
    let ms = reduce(li, s, false) / f32(p.d);
    let scale = 1.0 / sqrt(ms + p.eps);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[rb + i] = outs[rb + i] * scale * wv[i];
        }
    }
}

@compute @workgroup_size(64)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    let rb = row * p.d;
    var s = 0.0;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            s += xs[rb + i];
        }
    }
    let mean = reduce(li, s, false) / f32(p.d);
    var s2 = 0.0;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            let c = xs[rb + i] - mean;
            s2 += c * c;
        }
    }
    let rstd = 1.0 / sqrt(reduce(li, s2, false) / f32(p.d) + p.eps);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[rb + i] = (xs[rb + i] - mean) * rstd * wv[i] + bv[i];
        }
    }
}

@compute @workgroup_size(64)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    let rb = row * p.d;
    var m = -3.4028234e38;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            m = max(m, xs[rb + i]);
        }
    }
    let mx = reduce(li, m, true);
    var s = 0.0;
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            let e = exp(xs[rb + i] - mx);
            outs[rb + i] = e;
            s += e;
        }
    }
    let total = reduce(li, s, false);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[rb + i] = outs[rb + i] / total;
        }
    }
}

// RMS norm of the rows sel[0 .. n-1] of xs into rows 0 .. n-1 of outs (the logit rows)
@compute @workgroup_size(64)
fn rms_norm_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    var rb = 0u;
    if (valid) {
        rb = sel[row] * p.d;
    }
    let scale = xs_inv_rms(li, rb, valid);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[row * p.d + i] = xs[rb + i] * scale * wv[i];
        }
    }
}

// outs += rms_norm(xs) * w, row by row: a branch's output normed into the residual stream
// (post-attention and post-FFN norms, gemma)
@compute @workgroup_size(64)
fn rms_norm_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * p.gx;
    let valid = row < p.n;
    let rb = row * p.d;
    let scale = xs_inv_rms(li, rb, valid);
    if (valid) {
        for (var i = li; i < p.d; i += 64u) {
            outs[rb + i] = outs[rb + i] + xs[rb + i] * scale * wv[i];
        }
    }
}
