"""``modelc bench``: measure a model offline (load, prefill, batched decode, memory) or
load-test a running OpenAI-compatible server (modelc's or llama.cpp's) over HTTP.

``offline`` drives the runtime's batch API directly; ``loadgen`` is a trio + httpx
streaming SSE client pool; ``report`` turns either result into a table, JSON or a plot;
``timing`` holds the timing loops (warm-up, repeated and alternating runs, prefill and
greedy decode) that ``offline`` and the scripts in ``bench/`` share.
"""
