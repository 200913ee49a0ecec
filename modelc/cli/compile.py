"""``modelc compile MODEL -o DIR``: write a standalone project that serves one model.

Registered into the main CLI by ``register(subparsers)`` (``modelc.cli.EXTENSIONS``).
The project's forward pass is generated Cython specialised to the model; ``pip wheel
DIR`` builds it and the wheel serves the model without modelc installed (see
:mod:`modelc.compile`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from modelc.cli.args import add_options


def cmd_compile(args: argparse.Namespace) -> int:
    from modelc.cli.run import _model_id, _resolve
    from modelc.compile import compile_model
    from modelc.compile.spec import forward_note

    artifact = _resolve(args.model)
    name = args.name or _model_id(args.model)
    out = Path(args.output).expanduser()
    res = compile_model(artifact, out, name=name, force=args.force)
    s = res.spec
    sys.stdout.write(
        f"compiled {s['model_id']} ({s['architecture']}, {s['n_layer']} layers) into {out}\n"
        f"  {forward_note(s)}\n"
        f"  build:  pip wheel --no-deps -w {out / 'dist'} {out}\n"
        f"  serve:  {res.names.script} --port 8080   (after pip install of the wheel)\n"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the ``compile`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser(
        "compile",
        help="write a standalone Python project serving MODEL with a compiled forward pass",
    )
    p.add_argument("model", metavar="MODEL", help="a store name, catalog name or model path")
    add_options(p, "compile")
    p.set_defaults(func=cmd_compile)
