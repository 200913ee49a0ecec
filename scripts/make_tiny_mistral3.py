"""Goldens of the tiny Ministral 3 (``tests/gen_mistral3.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_mistral3
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("mistral3")
