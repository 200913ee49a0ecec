"""Moved to :mod:`modelc.bench.llamacpp` (the peer tests and bench share); re-exported here."""

from modelc.bench.llamacpp import LlamaCppClient, LlamaCppPeer, LlamaCppServer, main

__all__ = ["LlamaCppClient", "LlamaCppPeer", "LlamaCppServer"]

if __name__ == "__main__":  # python bench/llamacpp_peer.py GGUF ... (as bench/RESULTS.md runs it)
    main()
