// A mixture's (token, slot) pairs grouped by expert (webgpu_moe.py, a step of many rows):
// offs[e] .. offs[e + 1] - 1 index plist, which holds expert e's pairs (in no set order:
// each pair's products are its own), so moe_gemv_grouped reads each expert's rows once a
// step instead of once a pair.  One workgroup: counts, their prefix sum, then the places.

struct Params {
    pairs: u32,
    n_expert: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;  // each pair's expert
@group(0) @binding(1) var<storage, read_write> offs: array<u32>;  // (n_expert + 1,)
@group(0) @binding(2) var<storage, read_write> plist: array<u32>;  // (pairs,)
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> cursor: array<atomic<u32>, 512>;  // experts: webgpu_moe.MAX_GROUPED_EXPERTS

@compute @workgroup_size(256)
fn moe_group(@builtin(local_invocation_index) lid: u32) {
    for (var e = lid; e < p.n_expert; e += 256u) {
        atomicStore(&cursor[e], 0u);
    }
    workgroupBarrier();
    for (var i = lid; i < p.pairs; i += 256u) {
        atomicAdd(&cursor[ids[i]], 1u);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var s = 0u;
        for (var e = 0u; e < p.n_expert; e++) {
            let c = atomicLoad(&cursor[e]);
            offs[e] = s;
            atomicStore(&cursor[e], s);
            s += c;
        }
        offs[p.n_expert] = s;
    }
    workgroupBarrier();
    for (var i = lid; i < p.pairs; i += 256u) {
        plist[atomicAdd(&cursor[ids[i]], 1u)] = i;
    }
}
