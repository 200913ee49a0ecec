"""The wide GEMV's weight layouts (:mod:`.cuda_gemvw` reads them): GGUF blocks repacked
at upload so that a lane's quants sit 16 bytes aligned and its scales where one load or
one funnel shift finds them, and back (for the tests).  What each layout holds is
in :mod:`.cuda_gemvw`'s docstring; ``tests/test_cuda_repack.py`` checks them on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

REPACKED = (2, 12, 14)  # GGML's numbers of the types repacked at upload: Q4_0 Q4_K Q6_K
LAYOUT = "wide"
# Q6_K's 16 scales a super-block, reordered: new index 8 rr + 4 hh + f takes the stored
# 8 rr + 2 f + hh (scale of weights 16 hh .. of group 4 rr + f), lane 2 rr + hh's 4 in a word
Q6K_SCALES = np.array([8 * (m // 8) + 2 * (m % 4) + (m % 8) // 4 for m in range(16)])


def _padded(parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    rows = parts[0].shape[0]
    used = sum(p.shape[1] for p in parts)
    return np.concatenate([*parts, np.zeros((rows, -used % 16), np.uint8)], axis=1)


def repack(code: int, data: np.ndarray[Any, Any], cols: int) -> np.ndarray[Any, Any]:
    """GGUF blocks (rows, row_bytes) uint8 of a :data:`REPACKED` type to the wide layout:
    a row's quant bytes, then its scales (Q6_K: reordered by :data:`Q6K_SCALES`), then its
    f16 d's, padded to a multiple of 16 bytes."""
    rows = data.shape[0]
    if code == 2:
        b = data.reshape(rows, cols // 32, 18)
        return _padded([b[..., 2:].reshape(rows, -1), b[..., :2].reshape(rows, -1)])
    if code == 12:
        return _q4k_fields(data, cols)
    if code == 14:
        b = data.reshape(rows, cols // 256, 210)
        scales = b[..., 192:208][..., Q6K_SCALES]
        return _padded([b[..., :192].reshape(rows, -1), scales.reshape(rows, -1),
                        b[..., 208:].reshape(rows, -1)])  # fmt: skip
    raise ValueError(f"no wide layout for GGML type {code}")


def _q4k_fields(data: np.ndarray[Any, Any], cols: int, back: bool = False) -> np.ndarray[Any, Any]:
    """Q4_K rows (rows, row_bytes) with each super-block's 12 bytes of 6-bit scales and mins
    as stored (llama.cpp's get_scale_min_k4) turned into lane pairs' 24-bit fields (sub-block
    2c's scale, 2c + 1's, 2c's min, 2c + 1's, 6 bits each, at bit 24 c, little-endian), or
    back; d, dmin and the nibbles where they were."""
    b = data.reshape(data.shape[0], cols // 256, 144).copy()
    s = b[..., 4:16].astype(np.uint32)
    if not back:
        sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
        mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
        f = sc[..., 0::2] | sc[..., 1::2] << 6 | mn[..., 0::2] << 12 | mn[..., 1::2] << 18
        v = [
            f[..., 2 * k].astype(np.uint64) | f[..., 2 * k + 1].astype(np.uint64) << 24
            for k in (0, 1)
        ]
        b[..., 4:16] = np.concatenate([x[..., None].view(np.uint8)[..., :6] for x in v], -1)
        return b.reshape(data.shape[0], -1)
    w = [np.zeros(s.shape[:-1], np.uint64) for _ in (0, 1)]
    for k in (0, 1):
        for i in range(6):
            w[k] |= s[..., 6 * k + i].astype(np.uint64) << (8 * i)
    f = np.stack([(w[c // 2] >> (24 * (c % 2))) & 0xFFFFFF for c in range(4)], -1).astype(np.uint32)
    sc = np.stack([(f[..., i // 2] >> (6 * (i % 2))) & 63 for i in range(8)], -1)
    mn = np.stack([(f[..., i // 2] >> (12 + 6 * (i % 2))) & 63 for i in range(8)], -1)
    out = np.concatenate([sc[..., :4] | (sc[..., 4:] >> 4) << 6, mn[..., :4] | (mn[..., 4:] >> 4) << 6,
                          (sc[..., 4:] & 15) | (mn[..., 4:] & 15) << 4], -1)  # fmt: skip
    b[..., 4:16] = out
    return b.reshape(data.shape[0], -1)


def unpack(code: int, data: np.ndarray[Any, Any], cols: int) -> np.ndarray[Any, Any]:
    """:func:`repack`'s bytes back to the GGUF blocks (rows, row_bytes)."""
    rows = data.shape[0]
    if code == 12:
        return _q4k_fields(data, cols, back=True)
    if code == 2:
        ng = cols // 32
        q = data[:, : 16 * ng].reshape(rows, ng, 16)
        d = data[:, 16 * ng : 18 * ng].reshape(rows, ng, 2)
        return np.concatenate([d, q], axis=2).reshape(rows, -1)
    if code == 14:
        nsb = cols // 256
        q = data[:, : 192 * nsb].reshape(rows, nsb, 192)
        sc = np.empty((rows, nsb, 16), np.uint8)
        sc[..., Q6K_SCALES] = data[:, 192 * nsb : 208 * nsb].reshape(rows, nsb, 16)
        d = data[:, 208 * nsb : 210 * nsb].reshape(rows, nsb, 2)
        return np.concatenate([q, sc, d], axis=2).reshape(rows, -1)
    raise ValueError(f"no wide layout for GGML type {code}")


def host_layout(
    code: int, data: np.ndarray[Any, Any], cols: int, wide: bool
) -> tuple[np.ndarray[Any, Any], str]:
    """The bytes to upload for a part of type ``code`` and their layout ("" as stored,
    :data:`LAYOUT` repacked): repacked where ``wide`` (the wide GEMV is on) and the type
    has a wide layout."""
    if wide and code in REPACKED:
        return repack(code, data, cols), LAYOUT
    return data, ""
