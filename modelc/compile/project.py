"""Write the standalone project ``modelc compile`` produces.

Layout of ``DIR`` for a model whose package is ``<pkg>`` (``smollm2_135m_app``)::

    pyproject.toml, setup.py, README.md   pip wheel DIR builds it (Cython, C compiler)
    <pkg>/app.py                          the entry point, console script <slug>-serve
    <pkg>/_forward.pyx                    generated: the model's forward, constants inlined
    <pkg>/spec.json                       those constants, for people and tests
    <pkg>/model.modelc                    the artifact (package data)
    <pkg>/_rt/                            modelc's runtime and server, imports rewritten
    <pkg>/_rt/_kernels/                   the C kernels and their Cython wrappers
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import jinja2

import modelc
from modelc.artifact import load_artifact
from modelc.compile.spec import Spec, forward_note, model_spec
from modelc.compile.vendor import vendor, vendor_kernels
from modelc.errors import UsageError

TEMPLATES = Path(__file__).with_name("templates")
ARTIFACT_NAME = "model.modelc"


@dataclass(frozen=True, slots=True)
class Names:
    slug: str  # smollm2-135m
    package: str  # smollm2_135m_app
    dist: str  # smollm2-135m-app
    script: str  # smollm2-135m-serve

    @classmethod
    def of(cls, name: str) -> Names:
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        if not slug:
            raise UsageError(f"--name {name!r} has no letters or digits; give e.g. --name mymodel")
        if slug[0].isdigit():
            slug = f"m-{slug}"
        ident = slug.replace("-", "_")
        return cls(slug, f"{ident}_app", f"{slug}-app", f"{slug}-serve")


@dataclass(frozen=True, slots=True)
class Compiled:
    """What :func:`compile_model` wrote."""

    out: Path
    names: Names
    spec: Spec


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["repr"] = repr
    env.filters["flatten"] = lambda rows: [x for row in rows for x in row]
    return env


def _modules() -> dict[str, str]:
    """Where the runtime names the templates import live, relative to the package (read
    from the objects, so the templates follow modelc's own layout)."""
    from modelc.runtime.arch.bert import Bert, encoder_attention
    from modelc.runtime.arch.decoder import Decoder
    from modelc.runtime.arch.gpt2 import GPT2
    from modelc.runtime.arch.mlp import MLP
    from modelc.runtime.arch.moe import moe_ffn
    from modelc.runtime.backends.cpu import CpuBackend
    from modelc.runtime.model import begin_step, end_step

    objs: dict[str, Any] = {"Decoder": Decoder, "GPT2": GPT2, "Bert": Bert, "MLP": MLP}
    objs |= {"encoder_attention": encoder_attention, "moe_ffn": moe_ffn}
    objs |= {"begin_step": begin_step, "end_step": end_step, "TYPE_CODES": CpuBackend}
    return {k: v.__module__.removeprefix("modelc.") for k, v in objs.items()}


def _dependencies() -> list[str]:
    """modelc's run-time requirements (not its extras): what the copied server imports."""
    reqs = metadata.requires("modelc") or []
    return [r.split(";")[0].strip() for r in reqs if "extra ==" not in r]


def _packages(root: Path, pkg: str) -> list[str]:
    return sorted(
        ".".join(p.parent.relative_to(root).parts) for p in (root / pkg).rglob("__init__.py")
    )


def _data_globs(rt: Path) -> list[str]:
    suffixes = {p.suffix for p in rt.rglob("*") if p.is_file() and p.suffix not in (".py", "")}
    return [*sorted(f"**/*{s}" for s in suffixes), "py.typed"]


def _place_artifact(src: Path, dest: Path) -> None:
    """A hard link where the file system allows (artifacts are never modified in place),
    else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def compile_model(
    artifact: Path, out: Path, *, name: str | None = None, force: bool = False
) -> Compiled:
    """Write the project for the ``.modelc`` file ``artifact`` into ``out`` (see the
    module docstring); ``name`` (default: the artifact's stem) names the package and
    the model id its server reports."""
    model_id = name or artifact.stem
    names = Names.of(model_id)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UsageError(f"{out} is not empty; choose another -o DIR or pass --force")
        shutil.rmtree(out)
    spec = model_spec(load_artifact(artifact), model_id)
    pkg_dir = out / names.package
    pkg_dir.mkdir(parents=True)
    rt = pkg_dir / "_rt"
    private = f"{names.package}._rt"
    vendor(rt, private)
    vendor_kernels(
        rt / "_kernels",
        (TEMPLATES / "kernels_api.pyx").read_text(),
        (TEMPLATES / "kernels.pxd").read_text(),
        private,
    )
    env = _env()
    ctx: dict[str, Any] = {
        "spec": spec,
        "s": spec,
        "spec_json": repr(spec),
        "pkg": names.package,
        "dist": names.dist,
        "script": names.script,
        "version": modelc.__version__,
        "artifact_name": ARTIFACT_NAME,
        "dependencies": _dependencies(),
        "mods": _modules(),
        "note": forward_note(spec),
    }
    (pkg_dir / "_forward.pyx").write_text(
        env.get_template(f"{spec['template']}.pyx.j2").render(ctx)
    )
    (pkg_dir / "app.py").write_text(env.get_template("app.py.j2").render(ctx))
    (pkg_dir / "__init__.py").write_text(
        f'"""{model_id}, compiled by modelc compile: run ``{names.script}``."""\n'
    )
    (pkg_dir / "__main__.py").write_text(
        f"import sys\n\nfrom {names.package}.app import main\n\nsys.exit(main())\n"
    )
    (pkg_dir / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    _place_artifact(artifact, pkg_dir / ARTIFACT_NAME)
    ctx["packages"] = _packages(out, names.package)
    ctx["rt_data"] = _data_globs(rt)
    (out / "setup.py").write_text(env.get_template("setup.py.j2").render(ctx))
    (out / "pyproject.toml").write_text(env.get_template("pyproject.toml.j2").render(ctx))
    (out / "README.md").write_text(env.get_template("README.md.j2").render(ctx))
    return Compiled(out, names, spec)
