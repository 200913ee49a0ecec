// A mixture's routing and the sum of its experts' outputs (moe.py's route and _experts,
// softmax top-k renormalised: Mixtral, Qwen3-MoE), a thread a token.

struct Params {
    n: u32,  // tokens
    n_expert: u32,
    k: u32,  // experts a token
    d: u32,  // moe_combine: the row width
    gxs: u32,  // threads along x (indices past it go on in y)
    pad0: u32,
    col0: u32,  // moe_bias: the first column of each pair's row it adds to
    stride: u32,  // moe_bias: outs' row width
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;  // (n, n_expert); combine: (n * k, d)
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;  // (n, k) each token's experts
@group(0) @binding(2) var<storage, read_write> wts: array<f32>;  // (n, k) their weights
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> outs: array<f32>;  // combine: (n, d), added to

// each token's k most probable experts (softmax over all; ties to the lower id), in id
// order, and their probabilities renormalised to sum to 1: the softmax of the k logits
// alone, so gpt-oss's weighting too (its router's bias added to the logits before)
@compute @workgroup_size(64)
fn moe_route(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * p.gxs;
    if (t >= p.n) {
        return;
    }
    let row = t * p.n_expert;
    var mx = logits[row];
    for (var e = 1u; e < p.n_expert; e++) {
        mx = max(mx, logits[row + e]);
    }
    var total = 0.0;
    for (var e = 0u; e < p.n_expert; e++) {
        total += exp(logits[row + e] - mx);
    }
    // the k best, by rank: expert e is chosen when fewer than k others beat it
    var j = 0u;
    var sum = 0.0;
    for (var e = 0u; e < p.n_expert; e++) {
        let v = logits[row + e];
        var better = 0u;
        for (var o = 0u; o < p.n_expert; o++) {
            let w = logits[row + o];
            if (w > v || (w == v && o < e)) {
                better++;
            }
        }
        if (better < p.k) {
            let prob = exp(v - mx) / total;
            ids[t * p.k + j] = e;
            wts[t * p.k + j] = prob;
            sum += prob;
            j++;
        }
    }
    for (var s = 0u; s < p.k; s++) {
        wts[t * p.k + s] = wts[t * p.k + s] / sum;
    }
}

// outs[t][c] += the weighted sum of token t's experts' rows (logits binds their outputs,
// (n * k, d)), summed in id order
@compute @workgroup_size(64)
fn moe_combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.d) {
        return;
    }
    let t = i / p.d;
    let c = i % p.d;
    var s = 0.0;
    for (var j = 0u; j < p.k; j++) {
        s += logits[(t * p.k + j) * p.d + c] * wts[t * p.k + j];
    }
    outs[i] = outs[i] + s;
}

// each pair's expert's bias (logits binds the biases, (n_expert, d)) added to its row of
// outs (p.n pairs, p.d wide from column p.col0 of rows p.stride wide)
@compute @workgroup_size(64)
fn moe_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.d) {
        return;
    }
    let pair = i / p.d;
    let c = i % p.d;
    let o = pair * p.stride + p.col0 + c;
    outs[o] = outs[o] + logits[ids[pair] * p.d + c];
}
