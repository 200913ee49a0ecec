"""Goldens of the tiny LFM2 (``tests/gen_lfm2.py``); see ``scripts/tiny_goldens.py``.
Also the converter manifest of ``--outtype q8_0`` (``tests/golden/lfm2_q8_0_converter.json``),
the quantized file a user downloads.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_lfm2
"""

import json
from pathlib import Path

from scripts.make_tiny_families import GOLDEN, project_python
from scripts.tiny_goldens import converter_manifest, goldens

if __name__ == "__main__":
    goldens("lfm2")
    hf = Path(project_python("from tests.gen_lfm2 import ensure_model; print(ensure_model()[0])"))
    doc = converter_manifest(hf, "q8_0")
    (GOLDEN / "lfm2_q8_0_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
