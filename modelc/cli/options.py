"""The one table of the CLI's options, each declared once and tagged with its commands.

As llama.cpp's ``common/arg.cpp`` tags each option with the tools that take it, each
:class:`Opt` here names the commands (``"run"``, ``"generate"``, ``"deploy-k8s"`` for ``deploy k8s`` ...)
whose parsers get it; :func:`modelc.cli.args.add_options` builds a command's options
from the table, in table order.  An option that sets an engine option names its
:class:`~modelc.engine.options.EngineOptions` field (``engine``), one that sets a
sampling setting its sampling field (``sampling``), and
:func:`modelc.cli.args.engine_options` reads both back from the parsed arguments, the
same way for every command.  Positional arguments stay with their commands.

One flag with two meanings (``--max-tokens``: the server's cap in ``run``, one answer's
length in ``generate``, the load test's output length in ``bench``) is two entries
with disjoint commands; no command takes a flag twice.  Choices come from the enums and
tables that define them, imported when first needed (:class:`Values`), so building a
parser imports no numpy.
"""

from __future__ import annotations

import argparse
import builtins
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, overload

# = modelc.artifact.format.QUANT_METHODS (a copy: building a parser imports no numpy;
# tests/test_cli.py holds the two equal)
QUANTIZE_CHOICES = (
    "fp16", "int8", "int4", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m",
    "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs",
)  # fmt: skip


class Values(Sequence[str]):
    """The values of an enum (or the keys of a table) named ``module:name``, imported on
    first use: argparse only looks at choices to check a value or to print help."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self._values: tuple[str, ...] | None = None

    def values(self) -> tuple[str, ...]:
        if self._values is None:
            mod, _, name = self.ref.partition(":")
            obj = getattr(importlib.import_module(mod), name)
            self._values = tuple(str(getattr(v, "value", v)) for v in obj)
        return self._values

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self.values()[i]

    def __len__(self) -> int:
        return len(self.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.values())

    def __contains__(self, v: object) -> bool:
        return v in self.values()


KV_MODES = Values("modelc.runtime.kv_store:KVMode")
DEVICES = Values("modelc.engine.options:DEVICES")
DEVICE_SAMPLING = Values("modelc.engine.options:DEVICE_SAMPLING")
MATMUL_MODES = Values("modelc.runtime.backends.cpu:MATMUL_TOLS")
SPECULATE = ("auto", "fixed", "off")


def _context(v: str) -> int | str:
    """--max-context: tokens, or ``auto`` (``modelc run``: fitted to the memory budget)."""
    if v.strip().lower() == "auto":
        return "auto"
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of tokens or auto") from None


def _gpu_layers(v: str) -> int | str:
    """--n-gpu-layers: a number of layers, ``auto`` or ``all``."""
    text = v.strip().lower()
    if text in ("auto", "all"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"{v!r} is not a number of layers, auto or all")


def _layers(v: str) -> int:
    """A number of layers (0 or more)."""
    if v.strip().isdigit():
        return int(v.strip())
    raise argparse.ArgumentTypeError(f"{v!r} is not a number of layers")


def _mib(v: str) -> int:
    """--cache-ram: MiB (0 or more), as bytes."""
    if v.strip().isdigit():
        return int(v.strip()) << 20
    raise argparse.ArgumentTypeError(f"{v!r} is not a number of MiB (0 turns the cache off)")


def _speculate(v: str) -> dict[str, Any]:
    return {"speculative": v != "off", "spec_adaptive": v == "auto"}


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()  # no default given: argparse's own (None; False for a switch)


@dataclass(frozen=True, slots=True)
class Opt:
    """One option: its flags and argparse settings, and the commands that take it."""

    flags: tuple[str, ...]
    commands: frozenset[str]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = UNSET
    metavar: str | None = None
    choices: Sequence[str] | None = None
    action: str | builtins.type[argparse.Action] | None = None  # "store_true", "append" ...
    dest: str | None = None  # default: from the long flag
    required: bool = False
    env: str | None = None  # an environment variable that sets the same thing
    group: str | None = None  # options of one command in one group exclude each other
    section: str | None = None  # a titled argument group in the command's help
    # the EngineOptions field it sets, or a function of its value -> fields
    engine: str | Callable[[Any], dict[str, Any]] | None = None
    sampling: str | None = None  # the sampling field (SamplingParams) it sets

    @property
    def option_strings(self) -> tuple[str, ...]:
        """Its flags as the parser takes them (``--no-X`` too, for a BooleanOptionalAction)."""
        if self.action is argparse.BooleanOptionalAction:
            return (*self.flags, *(f"--no-{f[2:]}" for f in self.flags if f.startswith("--")))
        return self.flags

    @property
    def key(self) -> str:
        """The attribute of the parsed arguments that holds its value."""
        return self.dest or self.flags[-1].lstrip("-").replace("-", "_")


def _opt(flags: str, commands: str, help: str | None = None, **kw: Any) -> Opt:
    """An :class:`Opt` from ``"-o --output"`` and ``"pack export"``."""
    return Opt(tuple(flags.split()), frozenset(commands.split()), help, **kw)


ENGINE = "run generate chat"  # the commands that build an engine in-process
SAMPLE = "generate chat"  # those that send their own requests to it

# fmt: off
OPTIONS: list[Opt] = [
    # ---- output formats
    _opt("--json", "list search inspect bench ps", "print JSON instead of a table", action="store_true", group="format"),
    _opt("--names", "list", "model names only, one a line (shell completion)", action="store_true", group="format"),
    # ---- the store
    _opt("--force", "rm", "remove the model even if it has several versions", action="store_true", group="which"),
    _opt("--all", "rm", "remove every version of the model", action="store_true", group="which"),
    _opt("--all", "verify", "verify every model in the store", action="store_true"),
    _opt("--readme", "inspect", "a markdown model card", action="store_true", group="format"),
    _opt("--quant-sizes", "inspect", "sizes of the model in each quantization", action="store_true", group="format"),
    _opt("--tensors", "inspect", "include the tensor table", action="store_true"),
    _opt("--fit", "inspect", "what modelc run would fit in the memory budget: weights, KV per token, the context and sequences it allows", action="store_true", group="format"),
    # ---- packing
    _opt("-o --output", "pack", "write this file instead of adding to the store (a directory: DIR/NAME.modelc)", metavar="FILE.modelc"),
    _opt("-o --output", "export", "the file to write (a directory: DIR/NAME.safetensors); `modelc pack` reads it back", metavar="OUT.safetensors", required=True),
    _opt("--name", "pack pull", "store name (default: from the file name; pull: the catalog name)", metavar="NAME[:VERSION]"),
    _opt("--sha256", "pull", "expected sha256 of the downloaded file", metavar="HEX"),
    _opt("--compress", "pack pull", "zstd-compress each tensor (default from config)", action=argparse.BooleanOptionalAction),
    _opt("--level", "pack pull", "zstd level 1..22 (default 3)", type=int, metavar="N"),
    _opt("--quantize", "pack pull", "quantize weight matrices: fp16, int8 and int4 (GGML Q4_1 blocks) store every weight matrix in that type; q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl and iq4_xs are llama-quantize's mixes (its per-tensor types, its blocks bit for bit); matrices already quantized to another type are requantized through f32", choices=QUANTIZE_CHOICES),
    _opt("--imatrix", "pack pull", "llama.cpp importance matrix (llama-imatrix's GGUF, or a legacy .dat) steering a llama-quantize mix's quantizer, as llama-quantize --imatrix", metavar="FILE"),
    _opt("--prune", "pack pull", "zero weights with |w| < T before quantizing (quantized matrices are dequantized, pruned and requantized)", type=float, metavar="T"),
    # ---- compile, containerize, deploy k8s
    _opt("-o --output", "compile", "the project directory", metavar="DIR", required=True),
    _opt("--name", "compile", "the package and model name (default: the model's; the console script is NAME-serve)"),
    _opt("--force", "compile", "replace a non-empty DIR", action="store_true"),
    _opt("-o --output", "containerize", "build context to write", metavar="DIR", required=True),
    _opt("-o --output", "deploy-k8s", "directory to write", metavar="DIR", required=True),
    _opt("--name", "containerize", "model/image name (default: from MODEL)"),
    _opt("--name", "deploy-k8s", "object and model name (default: from MODEL)"),
    _opt("--tag", "containerize", "image tag (modelc-NAME:SHA12)", metavar="IMAGE"),
    _opt("--base", "containerize", "base image (default: python:3.X.Y-slim-bookworm for the wheel's Python)", metavar="IMAGE"),
    _opt("--wheel", "containerize", "modelc wheel to install (default: pip wheel --no-deps of this checkout)", metavar="FILE"),
    _opt("--port", "containerize", "port the server listens on (8080)", type=int, default=8080),
    _opt("--build", "containerize", "then run docker build (or podman)", action="store_true"),
    _opt("--image", "deploy-k8s", "image (default: containerize's modelc-NAME:SHA)"),
    _opt("--namespace", "deploy-k8s", default="default"),
    _opt("--replicas", "deploy-k8s", "replicas (2)", type=int, default=2, metavar="N"),
    _opt("--min-replicas", "deploy-k8s", "autoscaling min (1)", type=int, default=1, metavar="N"),
    _opt("--max-replicas", "deploy-k8s", "autoscaling max (8)", type=int, default=8, metavar="N"),
    _opt("--cpus", "deploy-k8s", "CPU request and threads (2)", type=int, default=2, metavar="N"),
    _opt("--memory", "deploy-k8s", "skip measuring; MiB per pod", type=int, metavar="MIB"),
    _opt("--max-concurrent", "deploy-k8s", "slots (8)", type=int, default=8, metavar="N"),
    _opt("--queue-size", "deploy-k8s", "waiting requests (64)", type=int, default=64, metavar="N"),
    _opt("--grace", "deploy-k8s", "drain seconds after SIGTERM (60)", type=int, default=60, metavar="S"),
    _opt("--queue-target", "deploy-k8s", "requests per replica, running + waiting, before scaling out (--max-concurrent)", type=int, metavar="N"),
    _opt("--prometheus", "deploy-k8s", "Prometheus KEDA queries", default="http://prometheus-server.monitoring.svc:80", metavar="URL"),
    _opt("--host", "deploy-k8s", "Ingress host (default: any)"),
    _opt("--header", "deploy-k8s", "request header the ingress hashes on (X-Conversation-Id)", default="X-Conversation-Id"),
    # ---- the server (run)
    _opt("--alias", "run", "names requests may use for a model (the first is the id responses report); one --alias per model, in order", action="append", default=[], metavar="NAME[,NAME...]"),
    _opt("--host", "run", "bind address (default from config: 127.0.0.1)"),
    _opt("--port", "run", "port (default from config: 8080; 0 = any free port)", type=int),
    _opt("--max-concurrent", "run", "sequences generating at once (engine default 8)", type=int, metavar="N", engine="max_concurrent"),
    _opt("--queue-size", "run", "requests waiting beyond those; more get 503 (engine default 64)", type=int, metavar="N", engine="queue_size"),
    _opt("--api-key", "run", "require 'Authorization: Bearer KEY'", metavar="KEY"),
    _opt("--cors-origins", "run", "browser origins allowed to call the server (CORS), comma-separated; * allows any", metavar="ORIGIN[,ORIGIN...]"),
    _opt("--allow-image-urls", "run", "fetch http(s) image URLs that chat requests name (at most 20 MiB and 10 s each); without it only inline data URLs are taken", action="store_true"),
    _opt("--max-memory", "run inspect", "memory the whole server may use: models are unloaded (least recently used first) or their KV budget fitted to stay inside it (e.g. 16G, 75%%; default 80%% of the RAM)", metavar="SIZE"),
    _opt("--max-gpu-memory", "run", "GPU memory the server's models may use when it computes on a GPU: idle models are unloaded (least recently used first) to stay inside it (e.g. 70G, 90%% of the GPU; default what is free on it at start)", metavar="SIZE"),
    _opt("--max-loaded-models", "run", "models loaded at once, at most (0 = as many as fit the memory)", type=int, default=0, metavar="N"),
    _opt("--rate-limit", "run", "at most N requests per minute per client address (0 = off)", type=int, default=0, metavar="N"),
    _opt("--reasoning-budget", "run", "tokens of thinking trace before its end is forced, as llama-server's: -1 any (default), 0 ends a trace as soon as it opens; a request's reasoning_budget_tokens overrides it", type=int, default=-1, metavar="N"),
    _opt("--reasoning-budget-message", "run", "text written before the forced end of a trace (as llama-server's)", metavar="TEXT"),
    _opt("--max-tokens", "run", "a request without max_tokens stops at the end of its turn or after N tokens (default 4096, or [sampling] max_tokens in config.toml)", type=int, metavar="N", engine="max_tokens"),
    # ---- one prompt or one conversation (generate, chat)
    _opt("--chat", "generate", "send PROMPT as a user message through the chat template", action="store_true"),
    _opt("--image", "generate", "an image (PNG, JPEG, WebP, GIF) before PROMPT in the user message (repeatable; needs --chat and --mmproj, as llama-mtmd-cli's --image)", action="append", default=[], metavar="PATH"),
    _opt("--system", SAMPLE, "a system message (generate: with --chat)", metavar="TEXT"),
    _opt("--max-tokens", SAMPLE, "stop each answer after N tokens (default: at the end of the turn, at most the server's cap)", type=int, metavar="N"),
    _opt("--temperature", SAMPLE, "0 = greedy (default: the model's, else 0.8 as llama-server)", type=float, metavar="T", sampling="temperature"),
    _opt("--top-k", SAMPLE, "keep the K most likely tokens (default: the model's)", type=int, metavar="K", sampling="top_k"),
    _opt("--top-p", SAMPLE, "nucleus sampling: keep tokens up to probability mass P", type=float, metavar="P", sampling="top_p"),
    _opt("--min-p", SAMPLE, "drop tokens less likely than P times the most likely one", type=float, metavar="P", sampling="min_p"),
    _opt("--repeat-penalty", SAMPLE, "penalty on recently generated tokens (1 = off)", type=float, metavar="R", sampling="repetition_penalty"),
    _opt("--stop", "generate", "a stop string (repeatable)", action="append", default=[], metavar="TEXT"),
    _opt("--seed", SAMPLE, "RNG seed (same seed, same text)", type=int, metavar="S"),
    # ---- the engine (every command that builds one)
    _opt("--max-context", ENGINE, "tokens per sequence (default: the model's); auto (modelc run): the longest that fits the memory budget", type=_context, metavar="N|auto", engine="max_context"),
    _opt("--kv-cache", f"{ENGINE} bench", "KV-cache storage (default f16; f32 is exact, int8/mixed are smaller)", choices=KV_MODES, engine="kv_cache"),
    _opt("--anchor-tokens", ENGINE, "tokens kept at the start on a context shift", type=int, metavar="N", engine="anchor_tokens"),
    _opt("--context-shift", ENGINE, "drop old tokens instead of stopping at the context", action="store_true", engine="context_shift"),
    _opt("--swa-full", ENGINE, "sliding-window layers keep every position in the KV cache (more memory; as llama.cpp's --swa-full)", action="store_true", engine="swa_full"),
    _opt("--cache-ram", ENGINE, "MiB of host memory the prefix cache keeps finished sequences' KV in, so a prompt that starts as an earlier one did is not computed again (as llama-server's --cache-ram); 0 = off (default 256)", type=_mib, metavar="MIB", engine="prefix_cache_bytes"),
    _opt("--prefill-chunk", ENGINE, "prompt tokens per sequence per step (0 = whole prompt)", type=int, metavar="N", engine="prefill_chunk"),
    _opt("--threads", f"{ENGINE} bench", "kernel threads (default: all cores)", type=int, metavar="N", env="MODELC_THREADS", engine="threads"),
    _opt("--speculate", ENGINE, "speculative decoding by prompt lookup: auto (default) drafts for prompts of --spec-min-prompt tokens or more, as many tokens as the measured acceptance makes worth verifying, none when it does not pay; fixed always drafts --spec-max tokens when the prompt has them; off never (a request can opt out with \"speculative\": false)", default="auto", choices=SPECULATE, engine=_speculate),
    _opt("--spec-max", ENGINE, "longest draft verified in one step (default 8)", type=int, metavar="N", engine="spec_gamma"),
    _opt("--spec-min-prompt", ENGINE, "auto: prompts shorter than N tokens never draft (default 128)", type=int, metavar="N", engine="spec_min_prompt"),
    _opt("--stream-interval", "run", "tokens a streamed response gets at a time (as vLLM's and SGLang's --stream-interval): 0 = auto (default): every token while fewer than 4 requests decode; when more do, at least 2 at a time, held until the oldest is 20 ms old (a frame every ~20 ms on a GPU's fast steps, 2 tokens a frame on slow ones), so a busy server spends its cores on the model rather than on writing frames; the first token always goes at once", type=int, metavar="N", engine="stream_interval"),
    _opt("--scheduler-steps", "run", "decode steps a scheduled batch runs before its tokens are delivered (as vLLM's multi-step scheduling): with N > 1 each sequence that can go on is fed its last token for up to N - 1 more steps, so the model does not wait for the server's delivery and planning between steps; a stop string found in the text takes back what followed it; one step while a request waits with a place free (--max-concurrent), a prompt is fed, or a sequence needs the scheduler between steps (a draft, a grammar). 1 = never (default: on an H100, 64 streams over HTTP, more steps a batch were slower); 0 = auto: more than one only where the measured gap between batches is over a tenth of their steps (a GPU's short steps), at most 20 ms of steps a batch", type=int, metavar="N", engine="scheduler_steps"),
    _opt("--chat-template-file", ENGINE, "a Jinja chat template that replaces the model's (as llama-server's --chat-template-file); the output format (thinking trace, tool calls) is read from it", metavar="PATH", engine="chat_template_file"),
    _opt("--mmproj", ENGINE, "the model's vision projector (an mmproj-*.gguf, as llama-server's --mmproj): images in on the chat routes (Gemma 3, Qwen2.5-VL, LFM2-VL; runs on the CPU)", metavar="FILE", engine="mmproj"),
    _opt("--no-mmproj", ENGINE, "leave out the vision projector a Hugging Face pull kept beside the model (as llama-server's --no-mmproj)", action="store_true", engine="no_mmproj"),
    _opt("--device", f"{ENGINE} bench", "where the model computes: cuda (NVRTC kernels through CuPy), cpu, or auto (cuda when CuPy sees a GPU and the architecture runs there; default); webgpu (WGSL shaders through wgpu on a Metal/Vulkan/D3D12 adapter) or metal (the same, on a Metal adapter only)", choices=DEVICES, engine="device"),
    _opt("-ngl --n-gpu-layers", f"{ENGINE} bench", "layers on the GPU with --device cuda (or auto), the rest on the CPU kernels, as llama.cpp's -ngl: a number, all, or auto (default): as many as fit the GPU's free memory beside their KV cache, so a model larger than the GPU still runs; without a GPU auto runs every layer on the CPU", type=_gpu_layers, metavar="N|auto|all", engine="n_gpu_layers"),
    _opt("--n-cpu-moe", f"{ENGINE} bench", "the experts of the first N layers of a mixture on the CPU kernels, the rest of the model on the GPU (--device cuda), as llama.cpp's --n-cpu-moe: a mixture larger than the GPU keeps its attention there; 0 (default): every layer's experts where the layer is", type=_layers, metavar="N", engine="n_cpu_moe"),
    _opt("--device-sampling", ENGINE, "where tokens are sampled: auto (default) on the GPU when the model computes there, so only the chosen tokens and the log-probabilities asked for come back; on: by the batched sampler whatever the device; off: on the host, row by row. Requests with a grammar, DRY, mirostat, typical-p, XTC, top-n-sigma, prompt log-probabilities or a draft to verify are sampled on the host either way", choices=DEVICE_SAMPLING, engine="device_sampling"),
    _opt("--grace", "run containerize", "seconds running streams get to finish on SIGINT/SIGTERM (30)", type=float, default=30.0, metavar="S"),
    _opt("--ping-interval", "run", "send an SSE ': ping' comment after S seconds without a token (10)", type=float, default=10.0, metavar="S"),
    _opt("--http-keep-alive", "run", "close a client's idle keep-alive connection after S seconds (30)", type=float, default=30.0, metavar="S"),
    _opt("--lora-dir", "run", "allow /lora/load of adapters under DIR (repeatable)", action="append", default=[], metavar="DIR"),
    # ---- bench: offline (MODEL)
    _opt("--prompt-lens", "bench", "prefill lengths", default="128,512,2048", metavar="L,..", section="offline (MODEL)"),
    _opt("--batches", "bench", "decode batch sizes", default="1,2,4,8", metavar="B,..", section="offline (MODEL)"),
    _opt("--steps", "bench", "decode steps per batch (32)", type=int, default=32, metavar="N", section="offline (MODEL)"),
    _opt("--reps", "bench", "repeats of each measurement, best kept (2)", type=int, default=2, metavar="N", section="offline (MODEL)"),
    _opt("--matmul", "bench", "MODELC_MATMUL mode", choices=MATMUL_MODES, env="MODELC_MATMUL", section="offline (MODEL)"),
    # ---- bench: load test (--url)
    _opt("--url", "bench", "an OpenAI-compatible server on loopback", section="load test (--url)"),
    _opt("--url", "ps", "the server (default: the config's host and port)"),
    _opt("--concurrency", "bench", "client counts (1,4,8)", default="1,4,8", metavar="C,..", section="load test (--url)"),
    _opt("--requests", "bench", "requests per level (16)", type=int, default=16, metavar="N", section="load test (--url)"),
    _opt("--prompt-len", "bench", "prompt words (~tokens)", type=int, default=128, metavar="L", section="load test (--url)"),
    _opt("--max-tokens", "bench", "output tokens (64)", type=int, default=64, metavar="M", section="load test (--url)"),
    _opt("--model", "bench", "model field", dest="model_name", metavar="NAME", section="load test (--url)"),
    _opt("--chat", "bench", "use /v1/chat/completions", action="store_true", default=None, section="load test (--url)"),
    _opt("--timeout", "bench", "per request (600)", type=float, default=600.0, metavar="S", section="load test (--url)"),
    _opt("--turns", "bench", "requests per conversation, each resending the history (shared prefixes) (1)", type=int, default=1, metavar="T", section="load test (--url)"),
    _opt("--temperature", "bench", "the requests' temperature (default 0: greedy)", type=float, metavar="T", sampling="temperature", section="load test (--url)"),
    _opt("--top-k", "bench", "the requests' top_k", type=int, metavar="K", sampling="top_k", section="load test (--url)"),
    _opt("--top-p", "bench", "the requests' top_p", type=float, metavar="P", sampling="top_p", section="load test (--url)"),
    _opt("--min-p", "bench", "the requests' min_p", type=float, metavar="P", sampling="min_p", section="load test (--url)"),
    _opt("--conversation-header", "bench", "send a per-conversation id in header NAME (e.g. X-Conversation-Id), for a proxy that hashes on it", metavar="NAME", section="load test (--url)"),
    _opt("--plot", "bench", "latency vs throughput plot", metavar="PNG", section="load test (--url)"),
    _opt("--markdown", "bench", "print a Markdown table", action="store_true", section="load test (--url)"),
]
# fmt: on


def options_of(command: str) -> list[Opt]:
    """The table's options that ``command`` takes, in table order."""
    return [o for o in OPTIONS if command in o.commands]
