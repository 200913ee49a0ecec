"""Goldens of the tiny LFM2 (``tests/gen_lfm2.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_lfm2
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("lfm2")
