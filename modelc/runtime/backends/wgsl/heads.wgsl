// Heads reshaped (Gemma 4's layers of two shapes in one KV cache: runtime/arch/gemma4.py's
// _pad, run on the device by webgpu_gemma4.py): rows of heads d_in wide (input rows
// `istride` floats apart) to rows of h_out heads d_out wide, written from column `oc` of
// output rows `ostride` floats apart.  Output head h takes input head h0 + h / rep (rep:
// the output heads an input head fills, GQA's repeats; h0: the first head taken), zeros
// past d_in (a narrower head padded), its first d_out values (a wider head cut back).

struct Params {
    n: u32,  // rows
    h_out: u32,
    d_out: u32,
    d_in: u32,
    rep: u32,
    h0: u32,
    istride: u32,
    ostride: u32,
    oc: u32,
    gxs: u32,  // threads along x (indices past it go on in y)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> xs: array<f32>;
@group(0) @binding(1) var<storage, read_write> outs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn reshape_heads(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    let w = p.h_out * p.d_out;
    if (i >= p.n * w) {
        return;
    }
    let r = i / w;
    let h = (i % w) / p.d_out;
    let j = i % p.d_out;
    var v = 0.0;
    if (j < p.d_in) {
        v = xs[r * p.istride + (p.h0 + h / p.rep) * p.d_in + j];
    }
    outs[r * p.ostride + p.oc + h * p.d_out + j] = v;
}
