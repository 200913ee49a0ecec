"""The WebGPU backend's non-matmul ops (norms, RoPE, attention, softmax, activations), a
mixin of :class:`modelc.runtime.backends.webgpu.WebGPUBackend`; the shaders are
``wgsl/norm.wgsl``, ``rope.wgsl``, ``attention.wgsl`` and ``elementwise.wgsl``.

Each call uploads its inputs, runs one submit and reads its result back (see the
backend's docstring).  Attention reads the KV cache from the host arrays it is given:
an f16 cache is uploaded as is (half the bytes) and widened in the shader.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.runtime.backend import F32Array, KVArray
from modelc.runtime.backends.fallback import NumpyFallback
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, Job, grid, shader_source

SCORES_BYTES = 32 << 20  # attention's scores scratch per dispatch


def _f32(a: np.ndarray[Any, Any]) -> F32Array:
    return np.ascontiguousarray(a, dtype=np.float32)


def _flat(n: int) -> tuple[int, int, int]:
    """(x, y, threads along x) of a 1-D dispatch of ``n`` threads in workgroups of 64."""
    gx, gy = grid(math.ceil(n / 64))
    return gx, gy, gx * 64


def _back(data: bytes, shape: tuple[int, ...], out: F32Array | None) -> F32Array:
    value = np.frombuffer(data, np.float32).reshape(shape)
    if out is None:
        return value.copy()
    out[...] = value
    return out


class ActivationOps(NumpyFallback):
    gpu: Gpu

    def _pipe(self, module: str, entry: str, *files: str) -> Any:
        return self.gpu.pipeline(module, entry, shader_source(*(files or (module,))))

    def _rowwise(
        self,
        entry: str,
        x: F32Array,
        vecs: Sequence[F32Array],
        eps: float,
        out: F32Array | None,
    ) -> F32Array:
        """norm.wgsl's ``entry`` over the rows of x (n, d), with per-column ``vecs``
        (weight, bias) bound at 1, 2."""
        x = _f32(x)
        d = x.shape[-1]
        n = x.size // d if d else 0
        if n == 0:
            return out if out is not None else np.empty_like(x)
        with self.gpu.lock:
            pipe = self._pipe("norm", entry)
            bind = {0: self.gpu.put("n_x", x), 3: self.gpu.scratch("n_out", x.nbytes)}
            for k, v in enumerate(vecs):
                bind[1 + k] = self.gpu.put(f"n_v{k}", _f32(v))
            gx, gy = grid(n)
            job = Job([Dispatch(pipe, bind, struct.pack("<IIIf", n, d, gx, eps), 4, (gx, gy, 1))])
            job.reads.append((bind[3][0], x.nbytes))
            (data,) = self.gpu.run(job)
        return _back(data, x.shape, out)

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        return self._rowwise("rms_norm", x, [weight], eps, out)

    def layer_norm(
        self,
        x: F32Array,
        weight: F32Array,
        bias: F32Array,
        eps: float,
        out: F32Array | None = None,
    ) -> F32Array:
        return self._rowwise("layer_norm", x, [weight, bias], eps, out)

    def softmax(self, x: F32Array) -> F32Array:
        res = self._rowwise("softmax", x, [], 0.0, None)
        x[...] = res
        return x

    # --- RoPE -----------------------------------------------------------------------------

    def rope_angles(
        self, positions: np.ndarray[Any, Any], inv_freq: F32Array
    ) -> tuple[F32Array, F32Array]:
        pos = np.asarray(positions).astype(np.int32).reshape(-1)
        inv = _f32(inv_freq).reshape(-1)
        n, hn = pos.size, inv.size
        if n * hn == 0:
            return np.zeros((n, hn), np.float32), np.zeros((n, hn), np.float32)
        with self.gpu.lock:
            pipe = self._pipe("rope", "rope_angles")
            cs = self.gpu.scratch("r_cos", n * hn * 4)
            sn = self.gpu.scratch("r_sin", n * hn * 4)
            bind = {0: self.gpu.put("r_pos", pos), 1: self.gpu.put("r_inv", inv), 2: cs, 3: sn}
            gx, gy, gxs = _flat(n * hn)
            params = struct.pack("<8I", n, 0, 0, hn, 0, gxs, 0, 0)
            job = Job([Dispatch(pipe, bind, params, 4, (gx, gy, 1))])
            job.reads += [(cs[0], n * hn * 4), (sn[0], n * hn * 4)]
            c, s = self.gpu.run(job)
        return _back(c, (n, hn), None), _back(s, (n, hn), None)

    def rope(self, x: F32Array, angles: tuple[F32Array, F32Array], neox: bool) -> F32Array:
        n, heads, hd = x.shape
        hn = angles[0].shape[1]
        if n * heads * hn == 0:
            return x
        buf = _f32(x)
        with self.gpu.lock:
            pipe = self._pipe("rope", "rope")
            bind = {
                2: self.gpu.put("r_cos", _f32(angles[0])),
                3: self.gpu.put("r_sin", _f32(angles[1])),
                5: self.gpu.put("r_x", buf),
            }
            gx, gy, gxs = _flat(n * heads * hn)
            params = struct.pack("<8I", n, heads, hd, hn, int(neox), gxs, 0, 0)
            job = Job([Dispatch(pipe, bind, params, 4, (gx, gy, 1))])
            job.reads.append((bind[5][0], buf.nbytes))
            (data,) = self.gpu.run(job)
        x[...] = np.frombuffer(data, np.float32).reshape(x.shape)
        return x

    # --- attention ------------------------------------------------------------------------

    def _attend(
        self,
        qs: Sequence[F32Array],
        ks: Sequence[KVArray],
        vs: Sequence[KVArray],
        q_pos0s: Sequence[int],
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> list[F32Array]:
        """Causal attention of each sequence over its own K/V, in one dispatch per chunk of
        query rows (the scores scratch stays under SCORES_BYTES); a window moves each row's
        first visible K/V row; soft-capped scores (gemma2) and sinks (gpt-oss: a logit per
        head in the softmax's denominator) in the shader too."""
        n_head, hd = qs[0].shape[1], qs[0].shape[2]
        n_head_kv = ks[0].shape[1]
        sizes = [q.shape[0] for q in qs]
        total = sum(sizes)
        if total == 0:
            return [np.empty_like(_f32(q)) for q in qs]
        f16 = all(a.dtype == np.float16 for a in (*ks, *vs))
        kv_dtype = np.float16 if f16 else np.float32
        info = np.empty((total, 2), np.uint32)  # per query row: first kv row, visible rows
        r = base = 0
        for q, k, p0 in zip(qs, ks, q_pos0s, strict=True):
            nq, nkv = q.shape[0], k.shape[0]
            pos = p0 + np.arange(nq)  # each row's position; it sees lo .. min(pos, nkv - 1)
            lo = np.maximum(pos - window + 1, 0) if window > 0 else np.zeros(nq, np.int64)
            info[r : r + nq, 0] = base + lo
            info[r : r + nq, 1] = np.maximum(np.minimum(nkv, pos + 1) - lo, 0)
            r += nq
            base += nkv
        sstride = max(1, int(info[:, 1].max()))
        chunk = max(1, min(65535, SCORES_BYTES // (n_head * sstride * 4)))

        def cat(arrs: Sequence[np.ndarray[Any, Any]], dtype: Any) -> np.ndarray[Any, Any]:
            flat = [np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrs]
            return np.concatenate(flat) if flat else np.zeros(0, dtype)

        with self.gpu.lock:
            pipe = self._pipe("attention", "attention", "half", "attention")
            ob = self.gpu.scratch("a_out", total * n_head * hd * 4)
            bind = {
                0: self.gpu.put("a_q", cat(qs, np.float32)),
                1: self.gpu.put("a_k", cat(ks, kv_dtype)),
                2: self.gpu.put("a_v", cat(vs, kv_dtype)),
                3: ob,
                5: self.gpu.put("a_info", info),
                6: self.gpu.scratch("a_scores", min(chunk, total) * n_head * sstride * 4),
                7: self.gpu.put("a_sinks", _f32(sinks if sinks is not None else np.zeros(1))),
            }
            job = Job()
            for row0 in range(0, total, chunk):
                rows = min(chunk, total - row0)
                params = struct.pack(
                    "<7I2f3I", row0, n_head, n_head_kv, hd, int(f16), sstride,
                    int(sinks is not None), scale, softcap, 0, 0, 0,
                )  # fmt: skip
                job.add(Dispatch(pipe, bind, params, 4, (rows, n_head, 1)))
            job.reads.append((ob[0], total * n_head * hd * 4))
            (data,) = self.gpu.run(job)
        res = np.frombuffer(data, np.float32).reshape(total, n_head, hd)
        splits = np.cumsum(sizes)[:-1]
        return [a.copy() for a in np.split(res, splits)]

    def attention(
        self,
        q: F32Array,
        k: KVArray,
        v: KVArray,
        q_pos0: int,
        scale: float,
        out: F32Array | None = None,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> F32Array:
        (res,) = self._attend([q], [k], [v], [q_pos0], scale, window, softcap, sinks)
        if out is None:
            return res
        out[...] = res
        return out

    def attention_batch(
        self,
        qs: Sequence[F32Array],
        ks: Sequence[KVArray],
        vs: Sequence[KVArray],
        q_pos0s: Sequence[int],
        scale: float,
        outs: Sequence[F32Array] | None = None,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> list[F32Array]:
        if not qs:
            return []
        res = self._attend(qs, ks, vs, q_pos0s, scale, window, softcap, sinks)
        if outs is None:
            return res
        for o, r in zip(outs, res, strict=True):
            o[...] = r
        return list(outs)

    def attention_append(
        self,
        q: F32Array,
        k_new: F32Array,
        v_new: F32Array,
        k_stores: Sequence[KVArray],
        v_stores: Sequence[KVArray],
        starts: Sequence[int],
        counts: Sequence[int],
        scale: float,
        out: F32Array,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> F32Array:
        r = 0
        qs, ks, vs = [], [], []
        for kst, vst, p0, n in zip(k_stores, v_stores, starts, counts, strict=True):
            kst[p0 : p0 + n] = k_new[r : r + n]  # the host store; f16 rounds to nearest even
            vst[p0 : p0 + n] = v_new[r : r + n]
            qs.append(q[r : r + n])
            ks.append(kst[: p0 + n])
            vs.append(vst[: p0 + n])
            r += n
        if qs:
            res = self._attend(qs, ks, vs, list(starts), scale, window, softcap, sinks)
            out[:r] = np.concatenate(res) if len(res) > 1 else res[0]
        return out

    # --- activations ------------------------------------------------------------------------

    def _elementwise(self, entry: str, xs: Sequence[F32Array], out: F32Array | None) -> F32Array:
        a = _f32(xs[0])
        if a.size == 0:
            return out if out is not None else np.empty_like(a)
        with self.gpu.lock:
            pipe = self._pipe("elementwise", entry)
            ob = self.gpu.scratch("e_out", a.nbytes)
            bind = {0: self.gpu.put("e_a", a), 2: ob}
            if len(xs) > 1:
                bind[1] = self.gpu.put("e_b", _f32(xs[1]))
            gx, gy, gxs = _flat(a.size)
            job = Job([Dispatch(pipe, bind, struct.pack("<4I", a.size, gxs, 0, 0), 3, (gx, gy, 1))])
            job.reads.append((ob[0], a.nbytes))
            (data,) = self.gpu.run(job)
        return _back(data, a.shape, out)

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        return self._elementwise("silu_mul", [gate, up], out)

    def gelu(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        return self._elementwise("gelu", [x], out)

    def gelu_erf(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        """On the host (BERT's FFN; no shader yet): the numpy twin's."""
        return self._fallback.gelu_erf(x, out)
