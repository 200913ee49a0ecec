// A mixture's routing and the sum of its experts' outputs (moe.py's route and _experts,
// softmax top-k renormalised: Mixtral, Qwen3-MoE), a thread a token.

struct Params {
    n: u32,  // tokens
    n_expert: u32,
    k: u32,  // experts a token
    d: u32,  // moe_combine, moe_bias: the row width; moe_route: the weights' scale (f32 bits)
    gxs: u32,  // threads along x (indices past it go on in y)
    flags: u32,  // moe_route: 1 sigmoid scores, 2 renormalised; moe_combine: 1 unweighted,
                 // 2 written (not added)
    col0: u32,  // moe_bias: the first column of each pair's row it adds to; moe_route: groups
    stride: u32,  // moe_bias: outs' row width; moe_route: the groups a token may use
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;  // (n, n_expert); combine: (n * k, d)
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;  // (n, k) each token's experts
@group(0) @binding(2) var<storage, read_write> wts: array<f32>;  // (n, k) their weights
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> outs: array<f32>;  // combine: (n, d), added to
@group(0) @binding(5) var<storage, read> ebias: array<f32>;  // route: (n_expert,) for the choice

// each token's k experts of highest score plus ebias (for the choice only; zeros where the
// mixture has none; ties to the lower id), in id order, weighted by their scores: softmax over all (or
// sigmoid, flags bit 0), renormalised to sum to 1 (flags bit 1; the sum at least f16's
// smallest normal, as llama.cpp), times the f32 of p.d's bits (moe.py's route).  Softmax
// renormalised is the softmax of the k logits alone: gpt-oss's weighting too (its
// router's bias added to the logits before)
fn score(row: u32, e: u32, mx: f32, total: f32) -> f32 {
    let l = logits[row + e];
    if ((p.flags & 1u) != 0u) {
        return 1.0 / (1.0 + exp(-l));
    }
    return exp(l - mx) / total;
}

fn pick(row: u32, e: u32, mx: f32, total: f32) -> f32 {
    return score(row, e, mx, total) + ebias[e];
}

// a group's score: the sum of its two best picks (DeepSeek V3's group routing)
fn group_score(row: u32, g: u32, size: u32, mx: f32, total: f32) -> f32 {
    var a = -3.4028234e38;  // the best
    var b = -3.4028234e38;  // the second
    for (var e = g * size; e < (g + 1u) * size; e++) {
        let v = pick(row, e, mx, total);
        if (v > a) {
            b = a;
            a = v;
        } else if (v > b) {
            b = v;
        }
    }
    return b + a;
}

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
    // in groups (p.col0 > 1): only the p.stride groups of best score (ties to the lower)
    var allowed = 0xffffffffu;
    let size = p.n_expert / max(p.col0, 1u);
    if (p.col0 > 1u) {
        allowed = 0u;
        for (var g = 0u; g < p.col0; g++) {
            let sg = group_score(row, g, size, mx, total);
            var better = 0u;
            for (var o = 0u; o < p.col0; o++) {
                let so = group_score(row, o, size, mx, total);
                if (so > sg || (so == sg && o < g)) {
                    better++;
                }
            }
            if (better < p.stride) {
                allowed |= 1u << g;
            }
        }
    }
    // the k best in k passes (O(k * n_expert)), each the best of those below the last one
    // chosen in the order (pick descending, id ascending)
    let at = t * p.k;
    var last_v = 0.0;
    var last_e = 0u;
    for (var s = 0u; s < p.k; s++) {
        var best_v = 0.0;
        var best_e = p.n_expert;  // none yet
        for (var e = 0u; e < p.n_expert; e++) {
            if (((allowed >> (e / size)) & 1u) == 0u) {
                continue;
            }
            let v = pick(row, e, mx, total);
            let below = s == 0u || v < last_v || (v == last_v && e > last_e);
            if (below && (best_e == p.n_expert || v > best_v)) {
                best_v = v;
                best_e = e;
            }
        }
        ids[at + s] = select(best_e, 0u, best_e == p.n_expert);  // (NaN scores: expert 0)
        last_v = best_v;
        last_e = best_e;
    }
    for (var a = 1u; a < p.k; a++) {  // in id order (insertion, k is small)
        let v = ids[at + a];
        var b = a;
        while (b > 0u && ids[at + b - 1u] > v) {
            ids[at + b] = ids[at + b - 1u];
            b--;
        }
        ids[at + b] = v;
    }
    var sum = 0.0;
    for (var s = 0u; s < p.k; s++) {
        let w = score(row, ids[at + s], mx, total);
        wts[at + s] = w;
        sum += w;
    }
    let scale = bitcast<f32>(p.d);
    let div = select(1.0, max(sum, 6.103515625e-5), (p.flags & 2u) != 0u);
    for (var s = 0u; s < p.k; s++) {
        wts[t * p.k + s] = wts[t * p.k + s] / div * scale;
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
    let unweighted = (p.flags & 1u) != 0u;  // llama 4: the weights scaled the experts' input
    for (var j = 0u; j < p.k; j++) {
        s += logits[(t * p.k + j) * p.d + c] * select(wts[t * p.k + j], 1.0, unweighted);
    }
    // flags & 2: outs written, not added to (gemma 4: the mixture's own buffer)
    outs[i] = select(outs[i], 0.0, (p.flags & 2u) != 0u) + s;
}

// each pair's weight times its expert's scale (logits binds the scales, (n_expert,);
// gemma 4's ffn_down_exps.scale), p.n pairs
@compute @workgroup_size(64)
fn moe_wscale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n) {
        return;
    }
    wts[i] = wts[i] * logits[ids[i]];
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

// llama 4 (llama4_moe.llama4_moe_ffn): each pair's input, its token's row of h (logits
// binds h, (n, d)) times the pair's weight, into outs (n * k, d)
@compute @workgroup_size(64)
fn moe_scale_in(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.gxs;
    if (i >= p.n * p.d) {
        return;
    }
    let pair = i / p.d;
    outs[i] = logits[(pair / p.k) * p.d + i % p.d] * wts[pair];
}
