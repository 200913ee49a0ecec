"""schemathesis against ``/openapi.json`` of a real ``modelc run`` (issue 15).

Every documented operation gets schema-made requests, valid and invalid: no 5xx, every
status, content type, header and body (SSE events included) as the document declares,
and schema-violating requests refused.  Not checked: that every schema-valid request is
accepted (schemathesis's ``positive_data_acceptance``); a server refuses valid JSON for
reasons no schema states (an embedding request to a chat model, a prompt longer than the
context, a Modelfile instruction it does not know), and those refusals are 4xx tested
elsewhere.  ``/infill`` answers 501 for a model without fill-in-the-middle tokens, as
llama.cpp's server does, so it runs without the no-5xx check.

``SCHEMATHESIS_EXAMPLES`` (default 5 per operation) and ``SCHEMATHESIS_SEED`` (default 1)
make a longer or different run; bench/RESULTS.md has one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, start

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "fixtures" / "schemathesis.toml"
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # a short context and default length keep schema-made generation requests quick
    srv = start(str(smollm2_gguf()), "--max-context", "512", "--max-tokens", "16")
    yield srv
    srv.stop()


def _schemathesis(srv: Server, checks: list[str], *where: str) -> None:
    exe = Path(sys.executable).with_name("schemathesis")
    cmd = [
        str(exe),
        "--config-file",
        str(CONFIG),
        "run",
        f"{srv.url}/openapi.json",
        "--max-examples",
        os.environ.get("SCHEMATHESIS_EXAMPLES", "5"),
        "--seed",
        os.environ.get("SCHEMATHESIS_SEED", "1"),
        "--phases",
        "examples,fuzzing",
        "--request-timeout",
        "60",
        "--continue-on-failure",
        "--no-shrink",
        "--checks",
        ",".join(checks),
        *where,
    ]
    env = {**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    summary = run.stdout[run.stdout.find("SUMMARY") :] if "SUMMARY" in run.stdout else ""
    print(summary)
    assert run.returncode == 0, f"schemathesis found failures:\n{run.stdout[-6000:]}"
    assert " passed" in summary and "generated" in summary, run.stdout[-3000:]


def test_every_operation_but_infill(server: Server) -> None:
    _schemathesis(server, CHECKS, "--exclude-path", "/infill")
    assert server.metric("modelc_requests_active") == 0


def test_infill(server: Server) -> None:
    _schemathesis(
        server, [c for c in CHECKS if c != "not_a_server_error"], "--include-path", "/infill"
    )
