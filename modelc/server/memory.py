"""Memory planning across the models one server loads (``--max-memory``,
``--max-loaded-models``, ``--max-context auto``).

The whole process must stay inside one budget: what it held before any model loaded (the
interpreter, the libraries: measured at start) plus, for each loaded model, its **cost**:
the memory its load took (measured around the load: weights read or repacked, buffers)
plus the KV memory its engine may reserve (the admission budget: a sequence is admitted
only when its whole length fits in it) plus its prefix cache's limit.  Before a model
loads, its cost is estimated from the file (its size, the KV a token takes from the
hyper-parameters).  When a model does not fit beside the loaded ones, the least recently
used idle models are unloaded first, as Ollama does; a model that still does not fit waits
while others are busy, or is refused with a line that says what would fit.  A model whose
default KV budget (every running sequence filling its context) is more than the room left
gets the room left as its KV budget instead — fewer long sequences at once, never an
out-of-memory kill — and with ``--max-context auto`` its context is the longest one
sequence can fill in that room.

A server computing on a GPU has a second budget, the GPU's memory (``--max-gpu-memory``,
default the memory free on it at start): each model's **GPU cost** is measured around its
load as the drop in free GPU memory (weights uploaded, KV caches, scratch), estimated before
it loads from the file and its KV (:func:`gpu_need`: the share of the file and KV of the
layers ``--n-gpu-layers`` sends there, less the experts ``--n-cpu-moe`` keeps on the CPU,
plus scratch).  Idle models are unloaded, least recently used first,
until the new one fits there too.  A model whose layers must all go to the GPU
(``--n-gpu-layers all`` or a number) and still cannot fit waits for busy ones or is
refused in one line; with ``auto`` it loads anyway and puts on the GPU only the layers its
free memory holds (the rest run on the CPU), as llama.cpp's ``--fit`` and Ollama do.

The planning itself (:func:`plan`) is pure: the registry measures, asks, then acts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from modelc.errors import UsageError

# a model needs at least this many tokens of one sequence's KV to be of use
MIN_CONTEXT = 512
# --max-memory's default: this share of the machine's RAM
DEFAULT_SHARE = 0.8
_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*(%|[kmgt]i?b?|b)?\s*$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_KV_BYTES = {"f32": 4.0, "f16": 2.0, "int8": 1.0 + 4 / 32, "mixed": 1.0 + 4 / 32}
GPU_SCRATCH = 256 << 20  # a model's activations and cuBLAS workspace on the GPU (estimate)


def total_ram() -> int:
    """The machine's RAM in bytes (a cgroup's limit where lower)."""
    ram = int(psutil.virtual_memory().total)
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text.isdigit():
            ram = min(ram, int(text))
    except OSError:
        pass
    return ram


def parse_size(
    text: str, *, flag: str = "--max-memory", of: str = "the RAM", total: int | None = None
) -> int:
    """Bytes from ``8G``, ``512MiB``, ``1.5g``, ``75%`` (of ``total``: by default the RAM)
    or a plain number; ``flag`` and ``of`` name them in errors."""
    m = _SIZE.match(text)
    if m is None:
        raise UsageError(
            f"{flag} {text!r} is not a size; use e.g. 8G, 512M, 75% (of {of}) or bytes"
        )
    n, unit = float(m.group(1)), (m.group(2) or "").lower()
    if unit == "%":
        if not 0 < n <= 100:
            raise UsageError(f"{flag} {text!r}: a share of {of} is between 0 and 100%")
        return int((total_ram() if total is None else total) * n / 100)
    return int(n * _UNITS[unit[:1]])


def rss() -> int:
    """This process's resident memory in bytes."""
    return int(psutil.Process().memory_info().rss)


def release_memory() -> None:
    """Give what an unloaded model held back to the system: collect its cycles, then ask
    glibc to return free heap pages (without it a freed heap stays resident)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):  # not glibc
            ctypes.CDLL(name).malloc_trim(0)


def kv_bytes_per_token(
    n_layer: int, n_head_kv: int, head_dim: int, kv_cache: str, *, generates: bool
) -> int:
    """An estimate of the KV memory one token takes (every layer's K and V rows)."""
    if not generates:
        return 0
    return int(2 * n_layer * n_head_kv * head_dim * _KV_BYTES.get(kv_cache, 4.0))


def gpu_need(
    file_size: int,
    n_layer: int,
    kv_default: int,
    n_gpu_layers: int | str,
    *,
    expert_bytes: Sequence[int] = (),
    n_cpu_moe: int = 0,
    scratch: int = GPU_SCRATCH,
    ends_bytes: int = 0,
) -> int:
    """An estimate of what a model would take of the GPU's memory: of its layers, the first
    ``n_gpu_layers`` (``auto`` / ``all``: every one) go there, so that share of the file
    without its routed experts (``expert_bytes``, by layer index) and of the KV
    ``kv_default``, plus the experts of those layers that ``n_cpu_moe`` does not keep on
    the CPU (``--n-cpu-moe N``: the first N layers' never go to the GPU), plus ``scratch``.
    ``ends_bytes`` (the embedding table and the output head) go with any GPU part whole
    (a split's GPU part holds both), not by share.  A dense model (no expert or end
    bytes) is the plain share of its file and KV."""
    layers = max(n_layer, 1)
    k = layers if n_gpu_layers in ("auto", "all") else min(int(n_gpu_layers), layers)
    if k <= 0:
        return scratch
    experts = sum(expert_bytes)
    on_gpu = sum(expert_bytes[min(max(n_cpu_moe, 0), k) : k])
    rest = file_size - experts - ends_bytes + kv_default
    return ends_bytes + int(rest * (k / layers)) + on_gpu + scratch


def prefix_split(
    prefix: int,
    gpu: int,
    n_gpu_layers: int | str,
    n_layer: int,
    gpu_limit: int,
    *,
    device_blocks: bool,
) -> tuple[int, int]:
    """Where a model's prefix cache (``prefix`` bytes at most) lives, as (host bytes, GPU
    bytes): a model wholly on the GPU keeps its blocks in GPU memory (``device_blocks``:
    ``MODELC_CUDA_PREFIX`` is not ``host``), ``--n-gpu-layers auto`` only when its layers
    and KV (``gpu`` bytes, :func:`gpu_need`) and the blocks fit ``gpu_limit`` (else it
    splits, and a split model's blocks are the host's), a CPU model's on the host."""
    if not gpu or not prefix or not device_blocks:
        return prefix, 0
    if n_gpu_layers == "auto":
        whole = gpu + prefix <= gpu_limit
    else:
        whole = n_gpu_layers == "all" or int(n_gpu_layers) >= n_layer
    return (0, prefix) if whole else (prefix, 0)


@dataclass(frozen=True, slots=True)
class Need:
    """What one model asks of the budget before it loads."""

    weights: int  # the load's own memory (estimated from the file, measured once loaded)
    kv_per_token: int  # estimated
    kv_default: int  # the KV budget it would take on its own (0: none, e.g. embeddings)
    prefix: int  # its prefix cache's limit
    n_ctx: int  # its context (before fitting)
    gpu: int = 0  # what it would take of the GPU's memory (0: it runs on the CPU)
    gpu_fits_part: bool = False  # --n-gpu-layers auto: less GPU memory means fewer layers there

    @property
    def least(self) -> int:
        """The smallest useful load: one sequence of MIN_CONTEXT tokens (or its context)."""
        return self.weights + self.prefix + self.kv_per_token * min(self.n_ctx, MIN_CONTEXT)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded model as the planner sees it."""

    name: str
    cost: int
    busy: bool  # requests are using it
    pinned: bool  # named on the command line: never unloaded for another
    last_used: float
    gpu: int = 0  # its measured share of the GPU's memory


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer: unload these, then load with this KV budget (and context)."""

    unload: tuple[str, ...]
    kv_budget: int | None  # None: the engine's default (it fits)
    n_ctx: int | None  # --max-context auto: the fitted context; None: unchanged


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now: busy models hold the memory; retry when one is released."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refuse:
    """It cannot fit, whatever is unloaded."""

    reason: str


def plan(
    name: str,
    need: Need,
    loaded: Sequence[Loaded],
    *,
    limit: int,
    base: int,
    max_loaded: int = 0,
    fit_context: bool = False,
    gpu_limit: int = 0,
) -> Plan | Wait | Refuse:
    """How to load ``name`` inside ``limit`` bytes, ``base`` of them the process's own and
    ``loaded`` the models in memory; at most ``max_loaded`` models (0: no count limit); on
    a GPU, also inside ``gpu_limit`` bytes of its memory (0: no GPU budget)."""
    alone = limit - base
    if need.least > alone:
        return Refuse(
            f"model {name!r} needs at least {_gib(need.least)} (weights {_gib(need.weights)}, "
            f"prefix cache {_gib(need.prefix)}, KV for {min(need.n_ctx, MIN_CONTEXT)} tokens) "
            f"and the server's budget leaves {_gib(alone)} for models (--max-memory "
            f"{_gib(limit)}, {_gib(base)} of it the server's own); raise --max-memory"
        )
    gpu_want = need.gpu if gpu_limit > 0 else 0
    if gpu_want > gpu_limit and not need.gpu_fits_part:
        return Refuse(
            f"model {name!r} needs {_gib(gpu_want)} of GPU memory (its layers and KV) and the "
            f"GPU's budget is {_gib(gpu_limit)} (--max-gpu-memory); use --n-gpu-layers auto "
            "(or fewer layers), a shorter --max-context, or --device cpu"
        )
    want = need.weights + need.prefix + need.kv_default
    idle = sorted((m for m in loaded if not m.busy and not m.pinned), key=lambda m: m.last_used)
    used = sum(m.cost for m in loaded)
    gpu_used = sum(m.gpu for m in loaded)
    count = len(loaded)
    unload: list[str] = []

    def room() -> int:
        return alone - used

    def gpu_short() -> bool:  # the GPU part does not fit yet
        return gpu_want > 0 and gpu_used + min(gpu_want, gpu_limit) > gpu_limit

    # unload idle models, least recently used first, until the model fits whole (or, when
    # it would not fit whole even alone, until its smallest useful load fits), its GPU part
    # fits and the count allows one more
    target = want if want <= alone else need.least
    for m in idle:
        if room() >= target and not gpu_short() and (max_loaded <= 0 or count < max_loaded):
            break
        unload.append(m.name)
        used -= m.cost
        gpu_used -= m.gpu
        count -= 1
    gpu_blocks = gpu_short() and not need.gpu_fits_part
    if room() < need.least or gpu_blocks or (max_loaded > 0 and count >= max_loaded):
        busy = [m.name for m in loaded if m.name not in unload and (m.busy or m.pinned)]
        if any(m.busy and not m.pinned for m in loaded if m.name not in unload):
            return Wait(f"model {name!r} waits for memory held by busy models {busy}")
        if gpu_blocks:
            return Refuse(
                f"model {name!r} does not fit on the GPU beside the models kept loaded "
                f"({', '.join(busy)}): {_gib(gpu_limit - gpu_used)} free of --max-gpu-memory "
                f"{_gib(gpu_limit)}, it needs {_gib(gpu_want)}; use --n-gpu-layers auto"
            )
        return Refuse(
            f"model {name!r} does not fit beside the models kept loaded ({', '.join(busy)}): "
            f"{_gib(room())} free of --max-memory {_gib(limit)}, it needs {_gib(need.least)}"
        )
    kv_room = room() - need.weights - need.prefix
    kv_budget = None if need.kv_default <= kv_room else kv_room
    n_ctx = None
    if fit_context and need.kv_per_token:
        n_ctx = max(MIN_CONTEXT, min(need.n_ctx, kv_room // need.kv_per_token))
    return Plan(tuple(unload), kv_budget, n_ctx)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
