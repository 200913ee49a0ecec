"""Goldens of the tiny Granite 4.0-H (``tests/gen_granite4.py``); see
``scripts/tiny_goldens.py``.  Also the converter manifest of ``--outtype q8_0``
(``tests/golden/granite4_q8_0_converter.json``), the quantized file a user downloads.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_granite4
"""

import json
from pathlib import Path

from scripts.make_tiny_families import GOLDEN, project_python
from scripts.tiny_goldens import converter_manifest, goldens

if __name__ == "__main__":
    goldens("granite4")
    code = "from tests.gen_granite4 import ensure_model; print(ensure_model()[0])"
    doc = converter_manifest(Path(project_python(code)), "q8_0")
    (GOLDEN / "granite4_q8_0_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
