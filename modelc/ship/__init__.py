"""Ship a model: a container build context (:mod:`.containerize`) and Kubernetes
manifests for a fleet of replicas (:mod:`.k8s`, sized by :mod:`.sizing`).

Both name what they ship the same way (:func:`shipped_model`): a DNS-1123 name from
the model's store name or file name, and a content-addressed image tag
``modelc-<name>:<first 12 hex of the artifact's sha256>``, so ``modelc deploy k8s``
points at the image ``modelc containerize`` writes without being told.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from modelc.errors import UsageError

_DNS_BAD = re.compile(r"[^a-z0-9-]+")


def dns_name(s: str, what: str = "name") -> str:
    """``s`` as a DNS-1123 label (lower case, digits and '-', at most 63 characters)."""
    out = _DNS_BAD.sub("-", s.lower()).strip("-")[:63].strip("-")
    if not out or not out[0].isalpha():
        raise UsageError(
            f"cannot make a Kubernetes/image {what} from {s!r}: give --name NAME "
            "(letters, digits and '-', starting with a letter)"
        )
    return out


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True, slots=True)
class ShippedModel:
    """A resolved ``.modelc`` artifact and the names it ships under."""

    artifact: Path  # the .modelc file
    name: str  # DNS-1123 label: image, Deployment, Service, model alias
    sha256: str

    @property
    def image(self) -> str:
        return f"modelc-{self.name}:{self.sha256[:12]}"

    @property
    def file_name(self) -> str:
        return f"{self.name}.modelc"


def model_name(arg: str) -> str:
    """The default name for a MODEL argument: a store name, or a file's stem."""
    p = Path(arg).expanduser()
    if p.exists():
        return p.name.removesuffix(".modelc") if p.is_dir() else p.stem
    return arg.partition(":")[0]


def shipped_model(artifact: Path, arg: str, name: str | None = None) -> ShippedModel:
    return ShippedModel(artifact, dns_name(name or model_name(arg)), file_sha256(artifact))
