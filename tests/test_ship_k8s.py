"""``modelc deploy k8s``: manifests measured from a real replica, validated offline against
the Kubernetes schemas (kubernetes-validate) and KEDA's own ScaledObject CRD schema."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from modelc.engine.options import EngineOptions
from modelc.resolve import packed_cache_path
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.30.0"
KEDA_CRD = ROOT / "tests" / "fixtures" / "ship" / "keda.sh_scaledobjects-v2.20.1.yaml"
FILES = ["deployment.yaml", "service.yaml", "pdb.yaml", "scaledobject.yaml", "ingress.yaml"]


def modelc(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MODELC_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "modelc.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``modelc deploy k8s SmolLM2 --replicas 3`` (measures one replica on loopback)."""
    tmp = tmp_path_factory.mktemp("k8s")
    r = modelc(
        "deploy", "k8s", str(smollm2_gguf()), "-o", str(tmp / "out"), "--replicas", "3",
        "--namespace", "llm", "--name", "smol", "--grace", "45", home=tmp / "home",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(Path(p).name for p in r.stdout.split()) == sorted([*FILES, "kustomization.yaml"])
    return {f: yaml.safe_load((tmp / "out" / f).read_text()) for f in FILES}


def _strict(schema: Any) -> Any:
    """A CRD schema that rejects unknown fields (the API server would prune them)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def keda_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(_strict(ver["schema"]["openAPIV3Schema"]))


def test_manifests_validate_against_kubernetes_and_keda_schemas(
    fleet: dict[str, dict[str, Any]],
) -> None:
    for f in ("deployment.yaml", "service.yaml", "pdb.yaml", "ingress.yaml"):
        kubernetes_validate.validate(fleet[f], K8S_VERSION, strict=True)  # raises if invalid
    so = fleet["scaledobject.yaml"]
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    keda_validator().validate(so)
    # the validators do reject: a wrong type, an unknown field
    bad = copy.deepcopy(fleet["deployment.yaml"])
    bad["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad_so = copy.deepcopy(so)
    bad_so["spec"]["minReplicas"] = 1  # KEDA's field is minReplicaCount
    assert not keda_validator().is_valid(bad_so)


def test_fleet_wiring(fleet: dict[str, dict[str, Any]]) -> None:
    dep, svc, pdb = fleet["deployment.yaml"], fleet["service.yaml"], fleet["pdb.yaml"]
    so, ing = fleet["scaledobject.yaml"], fleet["ingress.yaml"]
    assert {o["metadata"]["namespace"] for o in fleet.values()} == {"llm"}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for sel in (dep["spec"]["selector"]["matchLabels"], svc["spec"]["selector"]):
        assert sel.items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert dep["spec"]["replicas"] == 3
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"] == "smol"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("modelc-smol:")  # the tag `modelc containerize` writes
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    grace = {e["name"]: e.get("value") for e in c["env"]}["MODELC_GRACE"]
    assert grace == "45"
    term = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    prestop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert term > prestop + 45  # the drain fits before the kubelet's SIGKILL
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == svc["metadata"]["name"]
    assert backend["port"]["name"] == svc["spec"]["ports"][0]["name"]
    ann = ing["metadata"]["annotations"]
    assert ann["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_conversation_id"


def test_memory_is_weights_plus_kv_budget_plus_prefix_cache(
    fleet: dict[str, dict[str, Any]],
) -> None:
    """Reference: the KV budget from SmolLM2-135M's published dimensions, f16 cache."""
    n_layer, n_kv, head_dim, n_ctx = 30, 3, 64, 8192  # its config.json (known answer)
    kv_budget = 8 * n_ctx * 2 * n_layer * n_kv * head_dim * 2  # 8 slots, K and V, 2 bytes
    artifact = packed_cache_path(smollm2_gguf()).stat().st_size
    floor = artifact + kv_budget + EngineOptions().prefix_cache_bytes
    (c,) = fleet["deployment.yaml"]["spec"]["template"]["spec"]["containers"]
    mem = c["resources"]["requests"]["memory"]
    assert mem == c["resources"]["limits"]["memory"]
    m = re.fullmatch(r"(\d+)Mi", mem)
    assert m is not None
    assert floor < int(m.group(1)) << 20 < 1.1 * floor + (1 << 30)


def test_autoscaling_query_names_metrics_the_server_exports(
    fleet: dict[str, dict[str, Any]], smol_server: Server
) -> None:
    (trig,) = fleet["scaledobject.yaml"]["spec"]["triggers"]
    assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
    assert trig["metadata"]["threshold"] == "8"  # --max-concurrent: slots full, none waiting
    terms = re.findall(r"sum\((\w+)\{([^}]*)\}\)", trig["metadata"]["query"])
    assert [t[0] for t in terms] == ["modelc_engine_running", "modelc_engine_queued"]
    for name, labels in terms:
        assert smol_server.metric(name) == 0.0  # a real `modelc run` exports it (idle)
        assert 'model="smol"' in labels and 'namespace="llm"' in labels


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    model = str(smollm2_gguf())
    for args, msg in (
        (["--min-replicas", "3", "--replicas", "2"], "need --min-replicas <= --replicas"),
        (["--memory", "10"], "--memory is in MiB and must be >= 64"),
        (["--header", "X Conv"], "--header 'X Conv'"),
    ):
        r = modelc("deploy", "k8s", model, "-o", str(tmp_path / "o"), *args, home=tmp_path)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
