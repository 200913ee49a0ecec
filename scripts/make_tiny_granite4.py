"""Goldens of the tiny Granite 4.0-H, dense and with mixtures (``tests/gen_granite4.py``,
``granite4`` and ``granite4moe``); see ``scripts/tiny_goldens.py``.  Also the converter manifest of ``--outtype q8_0``
(``tests/golden/granite4_q8_0_converter.json``), the quantized file a user downloads.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_granite4 [granite4] [granite4moe]
"""

import json
import sys
from pathlib import Path

from scripts.make_tiny_families import GOLDEN, project_python
from scripts.tiny_goldens import converter_manifest, goldens

if __name__ == "__main__":
    for family in sys.argv[1:] or ["granite4", "granite4moe"]:
        goldens(family)
    code = "from tests.gen_granite4 import ensure_model; print(ensure_model()[0])"
    doc = converter_manifest(Path(project_python(code)), "q8_0")
    (GOLDEN / "granite4_q8_0_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
