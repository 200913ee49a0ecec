"""``modelc deploy k8s``: Kubernetes manifests for a fleet of replicas of one model.

Objects (one YAML file each, and a ``kustomization.yaml`` listing them):

* **Deployment**: N replicas of the image ``modelc containerize`` builds; memory
  request = limit = the measured need (:mod:`modelc.ship.sizing`); CPU request =
  ``--cpus`` and ``MODELC_THREADS`` from it (no CPU limit: a throttled decode step only
  adds latency); ``startupProbe`` and ``readinessProbe`` on ``/health`` (503 while
  loading and while draining, so a stopping pod leaves the endpoints at once);
  ``livenessProbe`` on ``/api/version`` (answered by the event loop in every state, so
  a long drain is never mistaken for a hang); ``preStop`` sleeps ``PRESTOP`` seconds
  so endpoints and ingress stop routing before SIGTERM; the server then gives running
  streams ``--grace`` seconds, and ``terminationGracePeriodSeconds`` = preStop +
  grace + ``EXIT_MARGIN`` covers both.
* **Service** (ClusterIP) and a **PodDisruptionBudget** (``maxUnavailable: 1``).
* **KEDA ScaledObject** on the fleet's queue depth from Prometheus: requests in the
  engines (``modelc_engine_running``, in a slot) plus those waiting for a slot
  (``modelc_engine_queued``), ``metricType: AverageValue``: desired replicas =
  ceil(depth / target).  The target defaults to ``--max-concurrent`` (every slot busy,
  nobody waiting); a target of slots + q trades about q x E2E / slots seconds of extra
  TTFT for fewer replicas (Little's law; bench/RESULTS.md).  Waiting requests alone
  would not do: at zero queue the HPA would scale a busy fleet down to its minimum.
  KEDA rather than an HPA through prometheus-adapter:
  the query lives in the object it scales (prometheus-adapter needs a cluster-wide
  rules ConfigMap shared by every team's metrics), and KEDA reads Prometheus itself.
* **Ingress** (ingress-nginx) with ``upstream-hash-by: $http_x_conversation_id``:
  consistent hashing sends a conversation's turns to the replica whose prefix cache
  holds its history; ``proxy-buffering: off`` and long read timeouts for SSE streams.
  Requests without the header all hash to one replica, so clients should send it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]  # (installed with gguf)

from modelc.errors import UsageError
from modelc.ship import dns_name

PRESTOP = 5  # seconds: endpoints and ingress drop the pod before SIGTERM arrives
EXIT_MARGIN = 15  # seconds after the drain: engine stop, connections closed, exit
CONVERSATION_HEADER = "X-Conversation-Id"

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    name: str
    image: str
    memory_bytes: int
    replicas: int = 2
    namespace: str = "default"
    port: int = 8080
    cpus: int = 2
    max_concurrent: int = 8
    queue_size: int = 64
    grace: int = 60  # seconds running streams get after SIGTERM (the longest drain)
    min_replicas: int = 1
    max_replicas: int = 8
    queue_target: int = 8  # requests per replica (running + waiting) before scaling out
    prometheus: str = "http://prometheus-server.monitoring.svc:80"
    ingress_host: str | None = None
    header: str = CONVERSATION_HEADER

    def check(self) -> None:
        dns_name(self.name)
        dns_name(self.namespace, "namespace")
        for flag, v, lo in (
            ("--replicas", self.replicas, 1),
            ("--cpus", self.cpus, 1),
            ("--max-concurrent", self.max_concurrent, 1),
            ("--queue-size", self.queue_size, 0),
            ("--grace", self.grace, 0),
            ("--min-replicas", self.min_replicas, 1),
            ("--queue-target", self.queue_target, 1),
        ):
            if v < lo:
                raise UsageError(f"{flag} must be >= {lo}, got {v}")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise UsageError(
                f"need --min-replicas <= --replicas <= --max-replicas, got "
                f"{self.min_replicas}, {self.replicas}, {self.max_replicas}"
            )
        if not self.header.replace("-", "").isalnum():
            raise UsageError(f"--header {self.header!r}: use letters, digits and '-'")

    @property
    def termination_grace(self) -> int:
        return PRESTOP + self.grace + EXIT_MARGIN

    @property
    def nginx_hash_key(self) -> str:
        return "$http_" + self.header.lower().replace("-", "_")


def _meta(spec: FleetSpec, **extra: Any) -> Manifest:
    return {"name": spec.name, "namespace": spec.namespace, "labels": _labels(spec), **extra}


def _labels(spec: FleetSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "modelc"}


def deployment(spec: FleetSpec) -> Manifest:
    sel = {"app.kubernetes.io/name": spec.name}
    mem = f"{math.ceil(spec.memory_bytes / (1 << 20))}Mi"
    health = {"path": "/health", "port": "http"}
    container = {
        "name": "modelc",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "--max-concurrent",
            str(spec.max_concurrent),
            "--queue-size",
            str(spec.queue_size),
        ],
        "env": [
            {"name": "MODELC_GRACE", "value": str(spec.grace)},
            {"name": "MODELC_PORT", "value": str(spec.port)},
            {
                "name": "MODELC_THREADS",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}},
            },
        ],
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": str(spec.cpus), "memory": mem},
            "limits": {"memory": mem},
        },
        "startupProbe": {
            "httpGet": health,
            "periodSeconds": 5,
            "failureThreshold": 60,  # 5 minutes to map the weights and warm up
        },
        "readinessProbe": {
            "httpGet": health,
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": {"path": "/api/version", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "state", "mountPath": "/var/lib/modelc"},
            {"name": "cache", "mountPath": "/var/cache/modelc"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": sel},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": _labels(spec),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": spec.termination_grace,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": v, "emptyDir": {}} for v in ("state", "cache", "tmp")],
                },
            },
        },
    }


def service(spec: FleetSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec),
        "spec": {
            "type": "ClusterIP",
            "selector": {"app.kubernetes.io/name": spec.name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pod_disruption_budget(spec: FleetSpec) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(spec),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": spec.name}},
        },
    }


def queue_query(spec: FleetSpec) -> str:
    sel = f'{{namespace="{spec.namespace}",model="{spec.name}"}}'
    return f"sum(modelc_engine_running{sel}) + sum(modelc_engine_queued{sel})"


def scaled_object(spec: FleetSpec) -> Manifest:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(spec),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name},
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        # a new replica takes its load time to help: scale in slowly
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                        },
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": spec.prometheus,
                        "query": queue_query(spec),
                        "threshold": str(spec.queue_target),
                        "ignoreNullValues": "true",
                    },
                }
            ],
        },
    }


def ingress(spec: FleetSpec) -> Manifest:
    rule: Manifest = {
        "http": {
            "paths": [
                {
                    "path": "/",
                    "pathType": "Prefix",
                    "backend": {"service": {"name": spec.name, "port": {"name": "http"}}},
                }
            ]
        }
    }
    if spec.ingress_host:
        rule["host"] = spec.ingress_host
    timeout = str(spec.grace + EXIT_MARGIN + 600)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": _meta(
            spec,
            annotations={
                "nginx.ingress.kubernetes.io/upstream-hash-by": spec.nginx_hash_key,
                "nginx.ingress.kubernetes.io/proxy-buffering": "off",
                "nginx.ingress.kubernetes.io/proxy-read-timeout": timeout,
                "nginx.ingress.kubernetes.io/proxy-send-timeout": timeout,
                "nginx.ingress.kubernetes.io/proxy-body-size": "16m",
            },
        ),
        "spec": {"ingressClassName": "nginx", "rules": [rule]},
    }


def manifests(spec: FleetSpec) -> dict[str, Manifest]:
    """File name -> object, in apply order."""
    spec.check()
    return {
        "deployment.yaml": deployment(spec),
        "service.yaml": service(spec),
        "pdb.yaml": pod_disruption_budget(spec),
        "scaledobject.yaml": scaled_object(spec),
        "ingress.yaml": ingress(spec),
    }


def write_manifests(spec: FleetSpec, out: Path, header: str) -> list[Path]:
    """Write each object to ``out`` (with ``header`` as a comment) and a kustomization."""
    objs = manifests(spec)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    paths = []
    for fname, obj in objs.items():
        p = out / fname
        p.write_text(comment + yaml.safe_dump(obj, sort_keys=False))
        paths.append(p)
    kust = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(objs),
    }
    k = out / "kustomization.yaml"
    k.write_text(comment + yaml.safe_dump(kust, sort_keys=False))
    return [*paths, k]
