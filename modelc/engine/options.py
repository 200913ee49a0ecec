"""Engine options (the server exposes them as ``modelc run`` flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from modelc.engine.speculative import DraftKind
from modelc.errors import UsageError
from modelc.runtime.chat_template import load_template_file
from modelc.runtime.kv_cache import KVMode
from modelc.runtime.prompt import DEFAULT_MAX_TOKENS

DEVICES = ("auto", "cpu", "cuda", "webgpu", "metal")  # where the engine computes (--device)
# where a step samples (--device-sampling): on the model's device (auto: when its logits
# live there; on: whenever it can, the numpy decoder's own host included) or on the host
DEVICE_SAMPLING = ("auto", "on", "off")


# --stream-interval auto: from AUTO_STREAM_BUSY decoding sequences, a response gets its
# tokens in hand-offs of at least 2, each holding tokens until the oldest has waited
# AUTO_STREAM_HOLD seconds (or AUTO_STREAM_MAX are held): a fast batch (a GPU's few ms a
# step) hands out a frame every ~20 ms instead of one a token, a slow one 2 at a time
# (MODELC_STREAM_HOLD_MS: another hold, for measurements)
AUTO_STREAM_BUSY = 4
AUTO_STREAM_HOLD = float(os.environ.get("MODELC_STREAM_HOLD_MS", "20")) / 1000
AUTO_STREAM_MAX = 16


def release_held(n_held: int, first: bool, age: float, busy: bool, interval: int) -> bool:
    """Whether a response's ``n_held`` held tokens go out now: the ``first`` of a response
    at once; with ``interval`` N (--stream-interval) N at a time; auto (0): every token
    unless ``busy`` (:data:`AUTO_STREAM_BUSY` decoding), else at least 2, once the oldest
    is ``age`` >= :data:`AUTO_STREAM_HOLD` seconds old or :data:`AUTO_STREAM_MAX` wait."""
    if n_held == 0:
        return False
    if first or interval == 1 or (interval == 0 and not busy):
        return True
    if interval:
        return n_held >= interval
    return n_held >= AUTO_STREAM_MAX or (n_held >= 2 and age >= AUTO_STREAM_HOLD)


@dataclass(slots=True)
class EngineOptions:
    max_concurrent: int = 8  # sequences decoding at once (--max-concurrent)
    queue_size: int = 64  # requests waiting beyond those; more are refused (--queue-size)
    max_context: int | None = None  # tokens per sequence; default: the model's context
    kv_cache: str = "f16"  # f32 | f16 | int8 | mixed (--kv-cache); f16 as llama.cpp
    kv_hot_window: int = 256  # mixed: recent tokens kept exact
    kv_budget_bytes: int | None = None  # default: every running sequence can fill its context
    # sliding-window layers keep every position, as global ones do (--swa-full, as
    # llama.cpp's): more KV memory, rollbacks and context shifts to any depth
    swa_full: bool = False
    context_shift: bool = False  # drop old tokens instead of refusing / stopping at the context
    anchor_tokens: int = 4  # tokens kept at the start on a context shift (--anchor-tokens)
    prefill_chunk: int = (
        256  # prompt tokens per sequence per step; 0 = whole prompt (--prefill-chunk)
    )
    step_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    prefix_cache_bytes: int = 256 << 20  # RAM for the prefix cache; 0 = off
    prefix_block_tokens: int = 32
    speculative: bool = True  # --speculate off sets False
    # auto (--speculate auto, the default): a per-request controller drafts when the
    # prompt has spec_min_prompt tokens and acceptance makes it pay, 1..spec_gamma tokens
    # (modelc/engine/spec_control.py); fixed: always spec_gamma tokens when the drafter
    # has them
    spec_adaptive: bool = True
    spec_gamma: int = 8  # longest draft verified per step (--spec-max)
    spec_min_prompt: int = 128  # auto: shorter prompts never draft (--spec-min-prompt)
    # auto: the controller prices a step by StepCost's prior instead of measured step
    # times, so a request drafts the same way however busy the machine is (tests)
    spec_fixed_cost: bool = False
    spec_max_running: int = 4  # draft only while at most this many sequences run (a big
    # batch already keeps the cores busy, so verifying drafts would only add work)
    draft: str = DraftKind.PROMPT_LOOKUP.value  # prompt-lookup | ngram | mlp
    threads: int | None = None  # kernel threads; default MODELC_THREADS or every core
    device: str = "auto"  # auto | cpu | cuda | webgpu | metal (--device): auto takes CUDA when CuPy sees a GPU
    # layers on the GPU, the rest on the CPU (--n-gpu-layers, llama.cpp's -ngl): a count,
    # "all", or "auto": as many as fit its free memory (all on the CPU without a GPU)
    n_gpu_layers: int | str = "auto"
    # the first N layers' experts on the CPU kernels, the rest of the model on the GPU
    # (--n-cpu-moe, llama.cpp's): a mixture larger than the GPU with its attention there
    n_cpu_moe: int = 0
    device_sampling: str = "auto"  # auto | on | off (--device-sampling): see DEVICE_SAMPLING
    max_tokens: int = DEFAULT_MAX_TOKENS  # a request without max_tokens stops here (--max-tokens)
    # a reader this many events behind pauses its request (no compute, KV kept) ...
    max_unread: int = 64
    # tokens handed to a response at a time (--stream-interval): 0 = auto, every token
    # while fewer than AUTO_STREAM_BUSY sequences decode, then release_held's hold (each
    # hand-off wakes the response and writes one frame through the HTTP stack: on a busy
    # batch that Python takes the cores from the kernels, or holds a GPU's next step
    # back); a response's first token and its last always go at once
    stream_interval: int = 0
    # decode steps one scheduled plan runs (--scheduler-steps, as vLLM's multi-step
    # scheduling): the runner goes on feeding each sequence its last token for up to
    # N - 1 more steps before the scheduler delivers (ModelRunner.execute); 0 = auto
    # (engine/batch_depth.py: more than 1 where the gap between batches is long). 1 by
    # default: on an H100 over HTTP, 64 streams, auto (it chose 3) and 4 were 5 % and 12 %
    # slower than 1 (bench/RESULTS.md "Multi-step batches"), though faster with the GPU's
    # step simulated
    scheduler_steps: int = 1
    stall_timeout: float = 30.0  # ... and a request paused this long is cancelled
    # a Jinja chat template that replaces the model's (--chat-template-file, as llama-server's)
    chat_template_file: str | None = None
    mmproj: str | None = None  # the vision projector GGUF (--mmproj, as llama-server's)
    no_mmproj: bool = False  # --no-mmproj: not the projector a pull kept beside the model
    # the server's sampling defaults (config.toml [sampling]); the model's own come first
    sampling: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """UsageError naming the first bad option."""
        checks: list[tuple[bool, str]] = [
            (
                self.max_concurrent >= 1,
                f"--max-concurrent must be at least 1, got {self.max_concurrent}",
            ),
            (self.queue_size >= 0, f"--queue-size must be >= 0, got {self.queue_size}"),
            (
                self.max_context is None or self.max_context >= 2,
                f"--max-context must be at least 2, got {self.max_context}",
            ),
            (
                self.kv_cache in {m.value for m in KVMode},
                f"--kv-cache must be f32, f16, int8 or mixed, got {self.kv_cache!r}",
            ),
            (
                self.kv_hot_window >= 1,
                f"the KV hot window must be at least 1, got {self.kv_hot_window}",
            ),
            (self.anchor_tokens >= 0, f"--anchor-tokens must be >= 0, got {self.anchor_tokens}"),
            (self.prefill_chunk >= 0, f"--prefill-chunk must be >= 0, got {self.prefill_chunk}"),
            (
                self.step_tokens >= 1,
                f"the step token budget must be at least 1, got {self.step_tokens}",
            ),
            (self.prefix_cache_bytes >= 0, "the prefix cache budget must be >= 0 bytes"),
            (self.prefix_block_tokens >= 1, "prefix cache blocks need at least 1 token"),
            (
                0 <= self.spec_gamma <= 16,
                f"the speculative draft length must be in 0..16, got {self.spec_gamma}",
            ),
            (
                self.spec_min_prompt >= 0,
                f"--spec-min-prompt must be >= 0, got {self.spec_min_prompt}",
            ),
            (
                self.spec_max_running >= 1,
                f"spec_max_running must be at least 1, got {self.spec_max_running}",
            ),
            (
                self.draft in {d.value for d in DraftKind},
                f"the draft must be prompt-lookup, ngram or mlp, got {self.draft!r}",
            ),
            (self.max_tokens >= 1, f"--max-tokens must be at least 1, got {self.max_tokens}"),
            (self.max_unread >= 1, f"max_unread must be at least 1, got {self.max_unread}"),
            (
                self.stream_interval >= 0,
                f"--stream-interval must be >= 0 (0: auto), got {self.stream_interval}",
            ),
            (self.stall_timeout > 0, f"stall_timeout must be > 0, got {self.stall_timeout}"),
            (
                0 <= self.scheduler_steps <= 64,
                f"--scheduler-steps must be 0 (auto) .. 64, got {self.scheduler_steps}",
            ),
            (
                self.device in DEVICES,
                f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}",
            ),
            (
                self.n_gpu_layers in ("auto", "all")
                or (type(self.n_gpu_layers) is int and self.n_gpu_layers >= 0),
                f"--n-gpu-layers must be a number of layers, auto or all; got {self.n_gpu_layers!r}",
            ),
            (
                self.device not in ("cpu", "webgpu", "metal") or self.n_gpu_layers in ("auto", 0),
                f"--n-gpu-layers {self.n_gpu_layers} needs --device cuda (or auto, with a GPU); "
                f"--device {self.device} runs every layer itself",
            ),
            (
                type(self.n_cpu_moe) is int and self.n_cpu_moe >= 0,
                f"--n-cpu-moe must be a number of layers, got {self.n_cpu_moe!r}",
            ),
            (
                self.device not in ("cpu", "webgpu", "metal") or self.n_cpu_moe == 0,
                f"--n-cpu-moe {self.n_cpu_moe} needs --device cuda (or auto, with a GPU); "
                f"--device {self.device} runs every expert itself",
            ),
            (
                self.device_sampling in DEVICE_SAMPLING,
                f"--device-sampling must be auto, on or off, got {self.device_sampling!r}",
            ),
            (
                self.threads is None or self.threads >= 1,
                f"--threads must be at least 1, got {self.threads}",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise UsageError(msg)
        if self.chat_template_file is not None:
            load_template_file(self.chat_template_file)  # a bad file: one line at start
