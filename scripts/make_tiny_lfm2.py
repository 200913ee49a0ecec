"""Goldens of the tiny LFM2 and LFM2-MoE (``tests/gen_lfm2.py``, ``tests/gen_lfm2moe.py``);
see ``scripts/tiny_goldens.py``.  Also the converter manifest of the LFM2's
``--outtype q8_0`` (``tests/golden/lfm2_q8_0_converter.json``), the quantized file a user
downloads.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_lfm2 [lfm2] [lfm2moe]
"""

import json
import sys
from pathlib import Path

from scripts.make_tiny_families import GOLDEN, project_python
from scripts.tiny_goldens import converter_manifest, goldens

if __name__ == "__main__":
    families = sys.argv[1:] or ["lfm2", "lfm2moe"]
    for family in families:
        goldens(family)
    if "lfm2" in families:
        hf = project_python("from tests.gen_lfm2 import ensure_model; print(ensure_model()[0])")
        doc = converter_manifest(Path(hf), "q8_0")
        (GOLDEN / "lfm2_q8_0_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
