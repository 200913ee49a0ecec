"""KV cache bytes of Gemma-3-shaped caches at 8k tokens, full storage against windowed
layers that keep only their window (issue 13).

    python scripts/kv_window_bytes.py [n_tokens]

The 270M and 1B shapes are allocated for real (f16, fed as the engine feeds: 256-token
prefill chunks, then single tokens for the last 512); the larger ones use
``KVCache.nbytes_at``, which tests/test_kv_window.py checks against real allocations.
llama.cpp's SWA cache, for reference, holds window + ubatch (512) rows per windowed layer.
"""

from __future__ import annotations

import sys

from modelc.runtime.kv_cache import KVCache, KVShape

# name: (layers, kv heads, head_dim, sliding window); every 6th layer is global
GEMMA3 = {
    "gemma3-270m": (18, 1, 256, 512),
    "gemma3-1b": (26, 1, 256, 512),
    "gemma3-4b": (34, 4, 256, 1024),
    "gemma3-12b": (48, 8, 256, 1024),
    "gemma3-27b": (62, 16, 128, 1024),
}


def fed(cache: KVCache, n: int) -> int:
    """Reserve and advance as the engine's steps would (no values written)."""
    while cache.n < n:
        m = 256 if cache.n < n - 512 else 1
        m = min(m, n - cache.n)
        cache.reserve(cache.n + m)
        cache.advance(m)
    return cache.nbytes


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    print(f"{'shape':12s} {'full MiB':>9s} {'windowed MiB':>13s} {'ratio':>6s}  (f16, {n} tokens)")
    for name, (layers, kv, hd, w) in GEMMA3.items():
        shape = KVShape(layers, kv, hd)
        wins = [0 if (i + 1) % 6 == 0 else w for i in range(layers)]
        full = KVCache(shape, n, "f16")
        win = KVCache(shape, n, "f16", windows=wins)
        if layers <= 26:
            a, b = fed(full, n), fed(win, n)
        else:
            a, b = full.nbytes_at(n, 256), win.nbytes_at(n, 256)
        print(f"{name:12s} {a / 2**20:9.1f} {b / 2**20:13.1f} {b / a:6.3f}")


if __name__ == "__main__":
    main()
