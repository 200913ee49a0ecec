"""Goldens of the tiny OLMo 3 (``tests/gen_olmo3.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_olmo3
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("olmo3")
