"""Goldens of the tiny Llama 4 (``tests/gen_llama4.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_llama4
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    # temperature tuning from position 7 on, and chunks of 8 positions (llama.cpp fixes
    # both at 8192): the prompts and continuations span up to 7 chunks
    goldens("llama4", variants=[{"floor_scale": 8}, {"attention_chunk_size": 8}])
