"""Synchronous numerical runtime: kernels, architectures, tokenizer, sampling, KV cache.

Knows nothing of requests, HTTP or trio.
"""
