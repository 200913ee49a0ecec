// Elementwise activations over flat arrays.

struct Params {
    n: u32,
    gxs: u32,  // threads along x (indices past it go on in y)
    pad0: u32,  // add_bias, scale_rows: the row width; silu_mul, gelu_mul: > 0, xa holds
                // rows of gate then up, each this wide (xb unread)
    pad1: u32,  // scale: the factor's bits (an f32); swiglu_oai: the clamp's
}

@group(0) @binding(0) var<storage, read> xa: array<f32>;
@group(0) @binding(1) var<storage, read> xb: array<f32>;
@group(0) @binding(2) var<storage, read_write> outs: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// element i's gate and up: xa[i] and xb[i], or (p.pad0 > 0) from one row of gate then up
fn gate_up(i: u32) -> vec2<f32> {
    if (p.pad0 == 0u) {
        return vec2<f32>(xa[i], xb[i]);
    }
    let at = (i / p.pad0) * 2u * p.pad0 + i % p.pad0;
    return vec2<f32>(xa[at], xa[at + p.pad0]);
}

// silu(gate) * up
@compute @workgroup_size(64)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    let gu = gate_up(i);
    let g = gu.x;
    outs[i] = g / (1.0 + exp(-g)) * gu.y;
}

// GELU, tanh approximation (the tanh argument clamped: tanh(+-10) is +-1 in float32, and
// some GPUs' tanh overflows to NaN on large inputs)
@compute @workgroup_size(64)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    let x = xa[i];
    let t = tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -10.0, 10.0));
    outs[i] = 0.5 * x * (1.0 + t);
}

// GELU (tanh) of gate times up: the FFN of gemma-like models in one pass
@compute @workgroup_size(64)
fn gelu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    let gu = gate_up(i);
    let x = gu.x;
    let t = tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -10.0, 10.0));
    outs[i] = 0.5 * x * (1.0 + t) * gu.y;
}

// outs[i] += b[i % width] (a bias on each row of width p.pad0)
@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    outs[i] = outs[i] + xb[i % p.pad0];
}

// outs[i] *= the factor (scaled embeddings, gemma)
@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    outs[i] = outs[i] * bitcast<f32>(p.pad1);
}

// outs[i] *= xb[row of i] (rows of width p.pad0: each query row by its attention temperature)
@compute @workgroup_size(64)
fn scale_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    outs[i] = outs[i] * xb[i / p.pad0];
}

// gpt-oss's clamped SwiGLU (moe_oai.swiglu_oai): g = min(gate, L), u = clamp(up, -L, L),
// (u + 1) * g * sigmoid(1.702 g), L the f32 bits of p.pad1, gate and up as gelu_mul's
@compute @workgroup_size(64)
fn swiglu_oai(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    let lim = bitcast<f32>(p.pad1);
    let gu = gate_up(i);
    let g = min(gu.x, lim);
    let u = clamp(gu.y, -lim, lim) + 1.0;
    outs[i] = g / (1.0 + exp(-1.702 * g)) * u;
}
