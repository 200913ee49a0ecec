"""WebGPU plumbing for :mod:`modelc.runtime.backends.webgpu`: the adapter, the device, the
compiled pipelines, scratch buffers and one-submit jobs.

wgpu (wgpu-py over wgpu-native) runs the WGSL shaders in ``wgsl/`` on Metal (macOS),
Vulkan (Linux, Windows; Mesa's software ``llvmpipe``/lavapipe included) or D3D12.  Its
OpenGL backend is not used: compute there is a compatibility path.  A job is a list of
dispatches recorded into one command buffer, submitted once, and waited for by mapping the
buffers it reads back.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from modelc.errors import ConfigError, UsageError

COMPUTE_BACKENDS = ("Metal", "Vulkan", "D3D12")
_ORDER = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
_SLOT = 256  # bytes per dispatch's parameters in the uniform ring (the largest offset alignment)
GROUPS_KEPT = 16384  # bind groups kept for reuse (Job.reuse_groups) before they are dropped
MAX_GROUPS = 65535  # workgroups per grid dimension (WebGPU's default limit)


def _wgpu() -> Any:
    try:
        import wgpu
    except ImportError as e:
        raise UsageError(
            "the webgpu/metal device needs the wgpu package: pip install 'modelc[gpu]', "
            "or use --device cpu"
        ) from e
    return wgpu


def _describe(adapter: Any) -> str:
    info = adapter.info
    return f"{info['backend_type']} {info['device'] or info['vendor'] or '?'}"


def find_adapter(require: str | None = None) -> Any:
    """The best WebGPU adapter whose backend computes (Metal, Vulkan, D3D12): a discrete GPU
    before an integrated one before a software one.  ``require``: a backend name the
    adapter must have (``"Metal"`` for ``--device metal``).  UsageError naming what was
    found, and what to do, where none fits."""
    wgpu = _wgpu()
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # wgpu-native's loader failing (no GPU library at all)
        raise UsageError(f"WebGPU found no adapter ({e}); use --device cpu") from e
    usable = [a for a in adapters if a.info["backend_type"] in COMPUTE_BACKENDS]
    if require is not None:
        usable = [a for a in usable if a.info["backend_type"] == require]
    if not usable:
        seen = ", ".join(_describe(a) for a in adapters) or "none"
        if require == "Metal":
            raise UsageError(
                f"--device metal: no Metal GPU adapter on this machine (WebGPU adapters: {seen}); "
                "use --device webgpu for a Vulkan/D3D12 one, or --device cpu"
            )
        raise UsageError(
            f"--device webgpu: no Metal, Vulkan or D3D12 adapter on this machine (WebGPU "
            f"adapters: {seen}); install a Vulkan driver (Debian: mesa-vulkan-drivers) or "
            "use --device cpu"
        )
    return min(usable, key=lambda a: _ORDER.get(str(a.info["adapter_type"]), 9))


@functools.cache
def metal_working_set() -> int | None:
    """Apple's ``recommendedMaxWorkingSetSize`` of the default Metal device (bytes the GPU
    should hold at once on unified memory), read through the Objective-C runtime; None off
    macOS or where it cannot be read.  (wgpu does not expose it.)"""
    if sys.platform != "darwin":
        return None
    try:
        import ctypes
        import ctypes.util

        metal = ctypes.CDLL("/System/Library/Frameworks/Metal.framework/Metal")
        objc = ctypes.CDLL(ctypes.util.find_library("objc"))
        metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
        device = metal.MTLCreateSystemDefaultDevice()
        objc.sel_registerName.restype = ctypes.c_void_p
        objc.sel_registerName.argtypes = [ctypes.c_char_p]
        sel = objc.sel_registerName(b"recommendedMaxWorkingSetSize")
        send = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)(
            ("objc_msgSend", objc)
        )
        return int(send(device, sel)) if device else None
    except (OSError, AttributeError, TypeError):
        return None


def memory_budget(backend_type: str) -> tuple[int | None, str]:
    """Bytes of weights the device may hold, and where that figure comes from:
    ``MODELC_WEBGPU_MEMORY`` (MiB) if set, else Metal's recommended working set, else none
    (WebGPU has no free-memory query; an allocation that fails is then the refusal)."""
    env = os.environ.get("MODELC_WEBGPU_MEMORY", "").strip()
    if env:
        try:
            mib = int(env)
        except ValueError as e:
            raise ConfigError(
                f"MODELC_WEBGPU_MEMORY={env!r} is not a whole number of MiB; unset it or give e.g. 4096"
            ) from e
        if mib < 1:
            raise ConfigError(f"MODELC_WEBGPU_MEMORY={mib} must be at least 1 (MiB)")
        return mib << 20, "MODELC_WEBGPU_MEMORY"
    if backend_type == "Metal":
        ws = metal_working_set()
        if ws:
            return ws, "Metal's recommended working set"
    return None, ""


@functools.cache
def shader_source(*names: str) -> str:
    """The WGSL files ``names`` of the package's ``wgsl/`` folder, joined in order."""
    root = resources.files("modelc.runtime.backends") / "wgsl"
    return "\n".join((root / f"{n}.wgsl").read_text(encoding="utf-8") for n in names)


def grid(n_groups: int) -> tuple[int, int]:
    """(x, y) workgroup counts covering ``n_groups`` (x at most 65535)."""
    x = max(1, min(n_groups, MAX_GROUPS))
    return x, max(1, math.ceil(n_groups / x))


def record_pass(cp: Any, calls: list[tuple[Any, Any, tuple[int, int, int]]]) -> None:
    """The calls (pipeline, bind group, workgroups) into the compute pass ``cp``, ended."""
    last = None
    for pipeline, group, groups in calls:
        if pipeline is not last:  # the pipeline stays set between dispatches
            cp.set_pipeline(pipeline)
            last = pipeline
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*groups)
    cp.end()


@dataclass
class Dispatch:
    """One compute dispatch: ``bind`` maps binding -> (buffer, bytes) for storage buffers,
    or (buffer, bytes, offset) for a part of one (the offset a multiple of the adapter's
    storage offset alignment); ``params`` are the uniform's bytes (bound at the module's
    ``params_binding``)."""

    pipeline: Any
    bind: Mapping[int, tuple[Any, ...]]
    params: bytes
    params_binding: int
    groups: tuple[int, int, int]


@dataclass
class Job:
    dispatches: list[Dispatch] = field(default_factory=list)
    reads: list[tuple[Any, int]] = field(default_factory=list)  # (buffer, bytes) read back
    # keep the bind groups for the next job of the same shape (a resident model's steps:
    # the same buffers at the same dispatch index), instead of making ~500 a step
    reuse_groups: bool = False

    def add(self, d: Dispatch) -> None:
        self.dispatches.append(d)


@dataclass
class Plan:
    """A job ready to run (:meth:`Gpu.plan`), and to run again while every buffer it binds
    is the one it was made with: per dispatch (pipeline, bind group, workgroups); the
    uniforms' image, one ``_SLOT`` of u32 words a dispatch (a caller may rewrite words
    before each :meth:`Gpu.run_plan`); the reads; the bound buffers, held so that no other
    buffer takes their ids while the plan is kept (a key of ids stays sound)."""

    ring: Any
    calls: list[tuple[Any, Any, tuple[int, int, int]]]
    params: np.ndarray[Any, np.dtype[np.uint32]]
    reads: list[tuple[Any, int]]
    held: tuple[Any, ...]


class Gpu:
    """One WebGPU device and what lives on it besides the weights."""

    # request "timestamp-query" where the adapter has it (a profiler sets this, before the
    # device is made: bench/webgpu_gap.py); ``timer``: an object that encodes a plan's
    # calls itself (webgpu_timer.PassTimer), None (the default) for the plain pass
    want_timestamps = False

    def __init__(self, require: str | None = None) -> None:
        self.wgpu = _wgpu()
        self.timer: Any = None
        self.adapter = find_adapter(require)
        lim = self.adapter.limits
        # byte offsets in the shaders are u32: no binding past 2 GiB even where allowed
        self.max_binding = min(int(lim["max-storage-buffer-binding-size"]), (1 << 31) - 256)
        self.max_buffer = int(lim["max-buffer-size"])
        try:
            feats = ["timestamp-query"] if self.timestamps_available else []
            self.device = self.adapter.request_device_sync(
                required_features=feats,
                required_limits={
                    "max-storage-buffer-binding-size": self.max_binding,
                    "max-buffer-size": self.max_buffer,
                },
            )
        except Exception as e:
            raise UsageError(
                f"WebGPU: {self.describe()} refused a device ({e}); use --device cpu"
            ) from e
        self.lock = threading.RLock()  # one job at a time on the queue
        self._pipelines: dict[tuple[str, str], Any] = {}
        self._modules: dict[str, Any] = {}
        self._scratch: dict[str, Any] = {}
        self._staging: dict[int, Any] = {}
        self._ring: Any = None
        # Job.reuse_groups' bind groups: key -> (group, the buffers it binds, held so that
        # their ids stay theirs); cleared past GROUPS_KEPT
        self._groups: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
        self.groups_made = 0
        self.offset_align = int(lim.get("min-storage-buffer-offset-alignment", 256))
        self.runs = 0  # jobs run (each one submit)
        self.uploaded = 0  # bytes of weights placed on the device
        self.budget, self.budget_source = memory_budget(str(self.adapter.info["backend_type"]))

    def describe(self) -> str:
        return _describe(self.adapter)

    @property
    def timestamps_available(self) -> bool:
        return self.want_timestamps and "timestamp-query" in self.adapter.features

    @property
    def unified_memory(self) -> bool:
        """Whether device memory is host memory (integrated and software adapters)."""
        return str(self.adapter.info["adapter_type"]) in ("IntegratedGPU", "CPU")

    def pipeline(self, key: str, entry: str, source: str) -> Any:
        """The compute pipeline of ``entry`` in the module ``key`` (compiled from ``source``
        on first use)."""
        hit = self._pipelines.get((key, entry))
        if hit is not None:
            return hit
        module = self._modules.get(key)
        if module is None:
            module = self.device.create_shader_module(label=key, code=source)
            self._modules[key] = module
        pipe = self.device.create_compute_pipeline(
            label=f"{key}.{entry}", layout="auto", compute={"module": module, "entry_point": entry}
        )
        self._pipelines[(key, entry)] = pipe
        return pipe

    def _usage_storage(self) -> int:
        u = self.wgpu.BufferUsage
        return int(u.STORAGE | u.COPY_DST | u.COPY_SRC)

    def scratch(self, name: str, nbytes: int) -> tuple[Any, int]:
        """A device buffer kept under ``name`` of at least ``nbytes`` (grown by powers of two),
        and the size to bind (``nbytes`` rounded up to whole words, at least 16)."""
        size = max(16, (nbytes + 3) & ~3)
        if size > self.max_binding:
            raise UsageError(
                f"WebGPU: a {size >> 20} MiB activation buffer ({name}) is over this adapter's "
                f"{self.max_binding >> 20} MiB binding limit; use smaller batches "
                "(--prefill-chunk) or --device cpu"
            )
        buf = self._scratch.get(name)
        if buf is None or buf.size < size:
            cap = min(1 << (size - 1).bit_length(), self.max_binding)
            if buf is not None:
                buf.destroy()
            buf = self.device.create_buffer(label=name, size=cap, usage=self._usage_storage())
            self._scratch[name] = buf
        return buf, size

    def put(self, name: str, arr: np.ndarray[Any, Any]) -> tuple[Any, int]:
        """``arr``'s bytes written into the scratch buffer ``name``: (buffer, bound size)."""
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        buf, size = self.scratch(name, data.nbytes)
        if data.nbytes % 4:
            data = np.concatenate([data, np.zeros(4 - data.nbytes % 4, np.uint8)])
        if data.nbytes:
            self.device.queue.write_buffer(buf, 0, data)
        return buf, size

    def weight_buffer(self, raw: np.ndarray[Any, Any], label: str) -> Any:
        """A device buffer holding ``raw`` (uint8 bytes, at most the binding limit)."""
        data = np.ascontiguousarray(raw).reshape(-1)
        if data.nbytes % 4:
            data = np.concatenate([data, np.zeros(4 - data.nbytes % 4, np.uint8)])
        u = self.wgpu.BufferUsage
        try:
            buf = self.device.create_buffer(
                label=label, size=max(16, data.nbytes), usage=int(u.STORAGE | u.COPY_DST)
            )
            self.device.queue.write_buffer(buf, 0, data)
        except Exception as e:  # out of device memory
            raise UsageError(
                f"WebGPU: cannot place a {data.nbytes >> 20} MiB weight on {self.describe()} "
                f"after {self.uploaded >> 20} MiB ({e}); use --device cpu or a smaller model"
            ) from e
        self.uploaded += data.nbytes
        return buf

    def _params_ring(self, nbytes: int) -> Any:
        if self._ring is None or self._ring.size < nbytes:
            u = self.wgpu.BufferUsage
            cap = 1 << max(12, (nbytes - 1).bit_length())
            self._ring = self.device.create_buffer(
                label="params", size=cap, usage=int(u.UNIFORM | u.COPY_DST | u.COPY_SRC)
            )
        return self._ring

    def _stage(self, nbytes: int) -> Any:
        cap = 1 << max(8, (nbytes - 1).bit_length())
        buf = self._staging.get(cap)
        if buf is None:
            u = self.wgpu.BufferUsage
            buf = self.device.create_buffer(
                label="staging", size=cap, usage=int(u.MAP_READ | u.COPY_DST)
            )
            self._staging[cap] = buf
        return buf

    def run(self, job: Job) -> list[bytes]:
        """Record the job's dispatches in one compute pass, copy what it reads to mappable
        buffers, submit, wait, and return those bytes (in ``job.reads`` order)."""
        return self.run_plan(self.plan(job))

    def plan(self, job: Job) -> Plan:
        """The job made ready to run (:meth:`run_plan`), once or again: its bind groups
        (found or made, as ``job.reuse_groups`` says) and its uniforms' image."""
        ring = self._params_ring(_SLOT * max(1, len(job.dispatches)))
        params = np.zeros((len(job.dispatches), _SLOT // 4), np.uint32)
        raw = params.view(np.uint8)
        calls = []
        for i, d in enumerate(job.dispatches):
            raw[i, : len(d.params)] = np.frombuffer(d.params, np.uint8)
            calls.append((d.pipeline, self._group(d, i, ring, job.reuse_groups), d.groups))
        held = tuple(r[0] for d in job.dispatches for r in d.bind.values())
        return Plan(ring, calls, params, list(job.reads), held)

    def run_plan(self, plan: Plan) -> list[bytes]:
        """Run a plan (:meth:`plan`), its ``params`` as they are now: one compute pass, the
        reads copied to mappable buffers, one submit, the wait; the read bytes back."""
        dev = self.device
        self.runs += 1
        if len(plan.params):
            dev.queue.write_buffer(plan.ring, 0, plan.params)
        enc = dev.create_command_encoder()
        if self.timer is not None:
            self.timer.encode(enc, plan.calls)
        else:
            record_pass(enc.begin_compute_pass(), plan.calls)
        # one staging buffer per read, at consecutive offsets of a single mapping; a job
        # that reads nothing waits for its work by reading 4 bytes of the uniforms
        # (queue.on_submitted_work_done_sync fails under wgpu-py 0.32's bindings)
        reads = plan.reads or ([(plan.ring, 4)] if plan.calls else [])
        offsets, total = [], 0
        for _, n in reads:
            offsets.append(total)
            total += (n + 255) & ~255
        stage = self._stage(max(total, 256)) if reads else None
        for (buf, n), off in zip(reads, offsets, strict=True):
            enc.copy_buffer_to_buffer(buf, 0, stage, off, (n + 3) & ~3)
        dev.queue.submit([enc.finish()])
        if stage is None:
            return []
        stage.map_sync(self.wgpu.MapMode.READ, 0, stage.size)  # the wait
        try:
            if not plan.reads:
                return []
            data = stage.read_mapped(0, stage.size)
            out = [
                bytes(data[off : off + n]) for (_, n), off in zip(plan.reads, offsets, strict=True)
            ]
        finally:
            stage.unmap()
        return out

    def _group(self, d: Dispatch, i: int, ring: Any, reuse: bool) -> Any:
        """The bind group of dispatch ``i`` (its parameters at slot ``i`` of ``ring``):
        made, or with ``reuse`` the one made for the same pipeline, buffers, offsets and
        sizes before."""
        binds = sorted((b, r[0], r[2] if len(r) > 2 else 0, r[1]) for b, r in d.bind.items())
        key: tuple[Any, ...] = ()
        if reuse:
            key = (id(d.pipeline), id(ring), i, len(d.params), d.params_binding)
            key += tuple((b, id(buf), at, n) for b, buf, at, n in binds)
            hit = self._groups.get(key)
            if hit is not None:
                return hit[0]
        entries = [
            {"binding": b, "resource": {"buffer": buf, "offset": at, "size": n}}
            for b, buf, at, n in binds
        ]
        entries.append(
            {
                "binding": d.params_binding,
                "resource": {"buffer": ring, "offset": i * _SLOT, "size": len(d.params)},
            }
        )
        group = self.device.create_bind_group(
            layout=d.pipeline.get_bind_group_layout(0), entries=entries
        )
        self.groups_made += 1
        if reuse:
            if len(self._groups) >= GROUPS_KEPT:
                self._groups.clear()
            self._groups[key] = (group, (d.pipeline, ring, *(buf for _, buf, _, _ in binds)))
        return group

    def read_region(self, buf: Any, offset: int, nbytes: int) -> bytes:
        """``nbytes`` of ``buf`` from ``offset`` (both multiples of 4), through a staging copy."""
        if nbytes == 0:
            return b""
        stage = self._stage(nbytes)
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, offset, stage, 0, nbytes)
        self.device.queue.submit([enc.finish()])
        stage.map_sync(self.wgpu.MapMode.READ, 0, stage.size)
        try:
            return bytes(stage.read_mapped(0, stage.size)[:nbytes])
        finally:
            stage.unmap()

    def copy_regions(self, copies: list[tuple[Any, int, Any, int, int]]) -> None:
        """Device copies (src, src offset, dst, dst offset, bytes) in one submit."""
        enc = self.device.create_command_encoder()
        for src, so, dst, do, n in copies:
            if n:
                enc.copy_buffer_to_buffer(src, so, dst, do, n)
        self.device.queue.submit([enc.finish()])

    def storage_buffer(self, nbytes: int, label: str) -> Any:
        """A fresh device buffer of ``nbytes`` (rounded up to 16) the shaders read and write."""
        try:
            return self.device.create_buffer(
                label=label, size=max(16, (nbytes + 15) & ~15), usage=self._usage_storage()
            )
        except Exception as e:  # out of device memory
            raise UsageError(
                f"WebGPU: cannot allocate {nbytes >> 20} MiB ({label}) on {self.describe()} "
                f"({e}); lower --max-concurrent or --max-context, or use --device cpu"
            ) from e


def vec(gpu: Gpu, a: Any, label: str) -> tuple[Any, int]:
    """An f32 vector (norm weights, biases) in a device buffer: (buffer, bytes)."""
    data = np.ascontiguousarray(a, np.float32).reshape(-1)
    buf = gpu.weight_buffer(data.view(np.uint8), label)
    return buf, buf.size


def u32s(*vals: int) -> bytes:
    """Uniform words, little-endian u32 each."""
    return struct.pack(f"<{len(vals)}I", *vals)


def aligned(nbytes: int, align: int) -> int:
    """The first binding offset at or past ``nbytes`` (a multiple of ``align``)."""
    return -(-nbytes // align) * align


def flat(n: int) -> tuple[int, int, int]:
    """(x, y) workgroups of 64 threads covering ``n`` threads, and the threads along x."""
    gx, gy = grid(math.ceil(n / 64))
    return gx, gy, gx * 64
