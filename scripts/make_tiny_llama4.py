"""Goldens of the tiny Llama 4 (``tests/gen_llama4.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_llama4
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    # temperature tuning from position 7 on (llama.cpp fixes the floor at 8192)
    goldens("llama4", variants=[{"floor_scale": 8}])
