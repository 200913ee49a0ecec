"""Memory planning across models (issue 36, must-show 3): ``--max-memory``,
``--max-loaded-models``, ``--max-context auto``.

The planner (:func:`modelc.server.memory.plan`) against known answers; then a real
``modelc run`` with three store models under a budget that fits two: requests name them in
turn, the least recently used idle one is unloaded for the next, every request is answered
(the same greedy text as the first time), ``/api/ps`` names exactly the loaded models at each
step, and the process's resident memory, sampled throughout, stays within 10% of the budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gguf import GGUFReader

from modelc.artifact import PackOptions, open_artifact, write_artifact
from modelc.engine.api import Engine
from modelc.engine.options import EngineOptions
from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.server import memory
from modelc.server.memory import Loaded, Need, Plan, Refuse, Wait, gpu_need, parse_size, plan
from modelc.server.models import MemoryLimits, ModelRegistry, ModelSlot
from modelc.server.state import load_model_info
from tests import net
from tests.assets import smollm2_gguf
from tests.gen_deepseek2 import ensure_model as ensure_deepseek2
from tests.gen_families import ensure_family
from tests.gen_gptoss import ensure_gptoss
from tests.server_fixtures import FORMATS, ROOT, Server, start

G = 1 << 30
M = 1 << 20


def need(weights: int = G, per_token: int = 1000, kv: int = G, prefix: int = 0) -> Need:
    return Need(weights, per_token, kv, prefix, 8192)


def test_parse_size() -> None:
    assert parse_size("8G") == 8 * G and parse_size("512MiB") == 512 * M
    assert parse_size("1.5g") == int(1.5 * G) and parse_size("1000") == 1000
    assert parse_size("50%") == int(memory.total_ram() * 0.5)
    for bad in ("lots", "8X", "0%", "150%"):
        with pytest.raises(UsageError, match="--max-memory"):
            parse_size(bad)


def test_fits_without_unloading() -> None:
    loaded = [Loaded("a", 2 * G, False, False, 1.0)]
    assert plan("b", need(), loaded, limit=10 * G, base=G) == Plan((), None, None)


def test_unloads_the_least_recently_used_idle_model_first() -> None:
    loaded = [
        Loaded("old", 3 * G, False, False, 1.0),
        Loaded("busy", 3 * G, True, False, 0.5),  # older, but in use
        Loaded("pinned", 1 * G, False, True, 0.1),  # the command line's: never unloaded
        Loaded("new", 3 * G, False, False, 2.0),
    ]
    # 11 G for models, 10 G used: b (2 G) needs one model out, the oldest idle one
    assert plan("b", need(), loaded, limit=12 * G, base=G) == Plan(("old",), None, None)
    # 4 G more needed: the two idle ones go, oldest first
    big = need(weights=3 * G, kv=2 * G)
    assert plan("b", big, loaded, limit=12 * G, base=G) == Plan(("old", "new"), None, None)


def test_waits_for_busy_models_and_refuses_what_never_fits() -> None:
    loaded = [Loaded("busy", 8 * G, True, False, 1.0)]
    assert isinstance(plan("b", need(), loaded, limit=10 * G, base=G), Wait)
    pinned = [Loaded("cli", 8 * G, False, True, 1.0)]
    refused = plan("b", need(), pinned, limit=10 * G, base=G)
    assert isinstance(refused, Refuse) and "kept loaded (cli)" in refused.reason
    alone = plan("b", need(weights=20 * G), [], limit=10 * G, base=G)
    assert isinstance(alone, Refuse) and "raise --max-memory" in alone.reason


def test_kv_budget_and_context_are_fitted_to_the_room_left() -> None:
    # 4 G for models, 1 G weights: the KV gets the 3 G left instead of its 8 G default
    p = plan("b", need(kv=8 * G, per_token=M), [], limit=5 * G, base=G, fit_context=True)
    assert p == Plan((), 3 * G, 3 * 1024)
    # a model that would not fit whole even alone unloads only what its least load needs
    loaded = [Loaded("a", G, False, False, 1.0), Loaded("c", G, False, False, 2.0)]
    p = plan("b", need(kv=100 * G, per_token=M), loaded, limit=5 * G, base=G)
    assert p == Plan((), 2 * G - G, None)


def test_max_loaded_models_counts() -> None:
    loaded = [Loaded("a", G, False, False, 2.0), Loaded("c", G, False, False, 1.0)]
    assert plan("b", need(), loaded, limit=64 * G, base=G, max_loaded=2) == Plan(("c",), None, None)


def test_the_gpu_budget_unloads_the_least_recently_used_idle_model_first() -> None:
    # RAM is plenty; the GPU (10 G) holds two 4 G models, a third needs 4 G
    loaded = [
        Loaded("old", G, False, False, 1.0, gpu=4 * G),
        Loaded("new", G, False, False, 2.0, gpu=4 * G),
    ]
    on_gpu = Need(G, 1000, G, 0, 8192, gpu=4 * G)
    assert plan("b", on_gpu, loaded, limit=64 * G, base=G, gpu_limit=10 * G) == Plan(
        ("old",), None, None
    )
    # without a GPU budget (a CPU server) the GPU figures are not looked at
    assert plan("b", on_gpu, loaded, limit=64 * G, base=G) == Plan((), None, None)
    # busy models hold the GPU: wait; pinned ones: refused in one line naming the flag
    busy = [Loaded("busy", G, True, False, 1.0, gpu=8 * G)]
    assert isinstance(plan("b", on_gpu, busy, limit=64 * G, base=G, gpu_limit=10 * G), Wait)
    pinned = [Loaded("cli", G, False, True, 1.0, gpu=8 * G)]
    refused = plan("b", on_gpu, pinned, limit=64 * G, base=G, gpu_limit=10 * G)
    assert isinstance(refused, Refuse) and "--n-gpu-layers auto" in refused.reason
    # more than the whole GPU with every layer there: refused before anything is unloaded
    huge = Need(G, 1000, G, 0, 8192, gpu=12 * G)
    alone = plan("b", huge, loaded, limit=64 * G, base=G, gpu_limit=10 * G)
    assert isinstance(alone, Refuse) and "--max-gpu-memory" in alone.reason


def test_auto_layers_take_what_the_gpu_has_left() -> None:
    # --n-gpu-layers auto: idle models still go first (least recently used) ...
    idle = [Loaded("a", G, False, False, 1.0, gpu=6 * G)]
    auto = Need(G, 1000, G, 0, 8192, gpu=6 * G, gpu_fits_part=True)
    assert plan("b", auto, idle, limit=64 * G, base=G, gpu_limit=10 * G) == Plan(("a",), None, None)
    # ... but a busy or pinned neighbour, or a model larger than the GPU, does not stop the
    # load: the layers that do not fit run on the CPU
    busy = [Loaded("a", G, True, False, 1.0, gpu=6 * G)]
    assert plan("b", auto, busy, limit=64 * G, base=G, gpu_limit=10 * G) == Plan((), None, None)
    bigger = Need(G, 1000, G, 0, 8192, gpu=30 * G, gpu_fits_part=True)
    assert plan("b", bigger, [], limit=64 * G, base=G, gpu_limit=10 * G) == Plan((), None, None)


def test_a_whole_gpu_models_prefix_cache_is_planned_in_gpu_memory() -> None:
    """A model wholly on the GPU keeps its prefix blocks there (``MODELC_CUDA_PREFIX``):
    the cache's limit moves from the host's budget to the GPU's; a split, CPU or
    ``MODELC_CUDA_PREFIX=host`` model keeps it on the host."""
    split = memory.prefix_split
    prefix = 256 * M
    assert split(prefix, 4 * G, "all", 32, 10 * G, device_blocks=True) == (0, prefix)
    assert split(prefix, 4 * G, 32, 32, 10 * G, device_blocks=True) == (0, prefix)
    assert split(prefix, 4 * G, 16, 32, 10 * G, device_blocks=True) == (prefix, 0)  # split
    assert split(prefix, 4 * G, "all", 32, 10 * G, device_blocks=False) == (prefix, 0)
    assert split(prefix, 0, "auto", 32, 0, device_blocks=True) == (prefix, 0)  # a CPU server
    assert split(0, 4 * G, "all", 32, 10 * G, device_blocks=True) == (0, 0)  # --cache-ram 0
    # auto: whole (blocks on the GPU) only when the layers, KV and blocks fit its budget
    assert split(prefix, 4 * G, "auto", 32, 10 * G, device_blocks=True) == (0, prefix)
    assert split(prefix, 10 * G - M, "auto", 32, 10 * G, device_blocks=True) == (prefix, 0)
    # what that changes in the plan: the host budget that had no room for the blocks fits
    # the model, and the GPU budget counts them
    host_only = Need(G, 1000, G, prefix, 8192, gpu=4 * G)
    on_gpu = Need(G, 1000, G, 0, 8192, gpu=4 * G + prefix)
    limit, base = 2 * G + G // 8, G // 16  # 2.06 G for models: weights and KV, not the blocks
    assert isinstance(plan("b", host_only, [], limit=limit, base=base, gpu_limit=10 * G), Plan)
    assert plan("b", host_only, [], limit=limit, base=base, gpu_limit=10 * G).kv_budget
    assert plan("b", on_gpu, [], limit=limit, base=base, gpu_limit=10 * G) == Plan((), None, None)
    # a pinned neighbour leaves room for the layers and KV but not the blocks as well
    pinned = [Loaded("a", G, False, True, 1.0, gpu=6 * G - prefix // 2)]
    assert plan("b", host_only, pinned, limit=64 * G, base=G, gpu_limit=10 * G) == Plan(
        (), None, None
    )
    refused = plan("b", on_gpu, pinned, limit=64 * G, base=G, gpu_limit=10 * G)
    assert isinstance(refused, Refuse) and "does not fit on the GPU" in refused.reason


S = memory.GPU_SCRATCH


def test_a_dense_models_gpu_estimate_is_its_share_of_the_file_and_kv() -> None:
    # 32 layers, an 8 G file, 2 G of KV: every layer there takes all of it, 16 layers half,
    # none only the scratch; no experts, so --n-cpu-moe changes nothing
    for ngl in ("auto", "all", 32, 40):
        assert gpu_need(8 * G, 32, 2 * G, ngl) == 10 * G + S
    assert gpu_need(8 * G, 32, 2 * G, 16) == 5 * G + S
    assert gpu_need(8 * G, 32, 2 * G, 0) == S
    assert gpu_need(8 * G, 32, 2 * G, "all", n_cpu_moe=4) == 10 * G + S
    assert gpu_need(8 * G, 32, 2 * G, 16, n_cpu_moe=4, scratch=0) == 5 * G
    # 1 G of it the embedding table and the head: whole on any GPU part, the rest by share
    for ngl in ("all", 32):
        assert gpu_need(8 * G, 32, 2 * G, ngl, ends_bytes=G) == 10 * G + S
    assert gpu_need(8 * G, 32, 2 * G, 16, ends_bytes=G) == G + (7 * G + 2 * G) // 2 + S
    assert gpu_need(8 * G, 32, 2 * G, 0, ends_bytes=G) == S


def test_the_experts_n_cpu_moe_keeps_on_the_cpu_are_left_out() -> None:
    # 4 layers, a 10 G file of which 8 G experts (2 G a layer), 2 G of KV: the rest of the
    # file and the KV, 4 G, go by the layers' share; each GPU layer's experts add 2 G
    # unless --n-cpu-moe keeps them on the CPU
    exps = (2 * G,) * 4

    def need(ngl: int | str, n_cpu_moe: int) -> int:
        return gpu_need(10 * G, 4, 2 * G, ngl, expert_bytes=exps, n_cpu_moe=n_cpu_moe)

    assert need("all", 0) == 12 * G + S  # every expert there: the whole file and KV
    assert need("auto", 0) == 12 * G + S
    assert need("all", 1) == 4 * G + 6 * G + S  # layers 1..3's experts
    assert need("all", 3) == 4 * G + 2 * G + S
    assert need("all", 4) == need("all", 99) == 4 * G + S  # no expert there
    # -ngl 3 above --n-cpu-moe 1: 3/4 of the 4 G, and layers 1 and 2's experts
    assert need(3, 1) == 3 * G + 4 * G + S
    # -ngl 2 below --n-cpu-moe 3: half of the 4 G, and no expert (layers 0, 1 keep theirs
    # on the CPU, layers 2, 3 are all on the CPU)
    assert need(2, 3) == 2 * G + S
    assert need(2, 0) == 2 * G + 4 * G + S  # without it: layers 0 and 1's experts
    assert need(0, 2) == S
    # a first dense layer (as DeepSeek's): 12 G, 9 G of it experts, 1 G of KV
    lead = (0, 3 * G, 3 * G, 3 * G)
    assert gpu_need(12 * G, 4, G, "all", expert_bytes=lead, n_cpu_moe=2) == 4 * G + 6 * G + S
    assert gpu_need(12 * G, 4, G, 2, expert_bytes=lead, n_cpu_moe=1) == 2 * G + 3 * G + S
    assert gpu_need(12 * G, 4, G, 2, expert_bytes=lead, n_cpu_moe=0, scratch=0) == 5 * G


def test_a_mixture_with_its_experts_on_the_cpu_fits_where_it_would_be_refused() -> None:
    # a gpt-oss-120b-like file (36 layers, 60 G, 57.6 G of it experts) on a 24 G GPU budget
    # with every layer there: refused while its experts count, a plan with --n-cpu-moe 36
    exps = (int(1.6 * G),) * 36

    def on_gpu(n_cpu_moe: int) -> Need:
        g = gpu_need(60 * G, 36, 2 * G, "all", expert_bytes=exps, n_cpu_moe=n_cpu_moe)
        return Need(60 * G, 1000, 2 * G, 0, 8192, gpu=g)

    assert on_gpu(36).gpu == 60 * G - 36 * int(1.6 * G) + 2 * G + S
    assert isinstance(plan("oss", on_gpu(0), [], limit=256 * G, base=G, gpu_limit=24 * G), Refuse)
    assert plan("oss", on_gpu(36), [], limit=256 * G, base=G, gpu_limit=24 * G) == Plan(
        (), None, None
    )


def _packed_moe(name: str) -> Path:
    return {
        "qwen3moe": lambda: ensure_family("qwen3moe")[1],
        "gptoss": lambda: ensure_gptoss("mxfp4")[1],  # MXFP4 experts and their biases
        "deepseek2": lambda: ensure_deepseek2("v2lite")[1],  # layer 0 dense, shared experts
    }[name]()


@pytest.mark.parametrize("family", ["qwen3moe", "gptoss", "deepseek2"])
def test_model_info_reads_each_layers_expert_bytes(family: str, tmp_path: Path) -> None:
    """A packed tiny mixture (compressed: its stored bytes are not its bytes in memory):
    ``load_model_info`` reports each layer's routed experts' bytes as the GGUF it came
    from has them (``*_exps.*``; the shared experts, ``*_shexp.*``, are not among them)."""
    src = _packed_moe(family)
    out = tmp_path / "m.modelc"
    write_artifact(load_model(src), out, PackOptions(compress=True))
    reference: dict[int, int] = {}
    for t in GGUFReader(src).tensors:
        if "_exps." in t.name:
            i = int(t.name.split(".")[1])
            reference[i] = reference.get(i, 0) + int(t.n_bytes)
    info = load_model_info(out, family)
    n_layer = info.kv_dims[0]
    assert info.expert_bytes == tuple(reference.get(i, 0) for i in range(n_layer))
    assert len(reference) > 1 and all(reference.values())
    if family == "deepseek2":
        assert info.expert_bytes[0] == 0 and 0 not in reference
    art = open_artifact(out)
    try:
        stored = sum(e.stored_nbytes for e in art.manifest.tensors if "_exps." in e.name)
    finally:
        art.close()
    assert stored != sum(info.expert_bytes)  # the bytes in memory, not in the file
    # the server's estimate, every layer on the GPU: the file and KV, less every expert
    # with --n-cpu-moe on all layers, less layer 0's with --n-cpu-moe 1
    kv = 3 * M

    def server(n_cpu_moe: int) -> int:
        opt = EngineOptions(device="cuda", n_gpu_layers="all", n_cpu_moe=n_cpu_moe)
        limits = MemoryLimits(64 * G, gpu_limit=8 * G)
        reg = ModelRegistry([ModelSlot(family, str(out))], opt, _no_engine, limits=limits)
        return reg._gpu_need(info, kv)

    whole = info.file_size + kv + S
    assert server(0) == whole
    assert server(n_layer) == whole - sum(reference.values())
    assert server(1) == whole - reference.get(0, 0)


def _no_engine(path: Path, name: str, opt: EngineOptions) -> Engine:
    raise AssertionError("no model is loaded here")


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_a_dense_models_info_has_no_expert_bytes_and_its_ends(family: str, tmp_path: Path) -> None:
    """No experts; the embedding table's and the head's bytes as the GGUF has them (one
    table where the head is tied to it)."""
    src = ensure_family(family)[1]
    write_artifact(load_model(src), tmp_path / "m.modelc", PackOptions())
    info = load_model_info(tmp_path / "m.modelc", family)
    assert info.expert_bytes == ()
    ends = [t for t in GGUFReader(src).tensors if t.name in ("token_embd.weight", "output.weight")]
    assert ends and info.ends_bytes == sum(int(t.n_bytes) for t in ends)


def test_max_gpu_memory_sizes() -> None:
    assert parse_size("50%", flag="--max-gpu-memory", of="the GPU", total=80 * G) == 40 * G
    with pytest.raises(UsageError, match=r"--max-gpu-memory .9X. is not a size.*of the GPU"):
        parse_size("9X", flag="--max-gpu-memory", of="the GPU", total=80 * G)


def test_max_gpu_memory_on_a_cpu_server_is_a_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, "MODELC_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "modelc", "run", str(smollm2_gguf()), "--device", "cpu",
         "--max-gpu-memory", "8G"],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode != 0
    assert "--max-gpu-memory needs a GPU the server computes on" in out.stderr


# --- a real server: three models, a budget for two ------------------------------------------
def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _loaded(srv: Server) -> set[str]:
    return {m["name"] for m in net.get(f"{srv.url}/api/ps", timeout=10).json()["models"]}


def _ask(srv: Server, model: str) -> str:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 6}
    r = net.post(f"{srv.url}/v1/completions", json={**body, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding SmolLM2 under three names."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "MODELC_HOME": str(home)}
    cli = [sys.executable, "-m", "modelc.cli"]
    steps = [["pack", str(smollm2_gguf()), "--name", "smol-a"]]
    steps += [["cp", "smol-a", f"smol-{x}"] for x in "bc"]
    for args in steps:
        subprocess.run([*cli, *args], cwd=ROOT, env=env, check=True, capture_output=True)
    return home


SERVE = [str(FORMATS / "mlp.safetensors"), "--max-context", "512", "--max-concurrent", "2"]


def _server(home: Path, *extra: str) -> Server:
    return start(SERVE[0], *SERVE[1:], *extra, home=home)


@pytest.fixture(scope="module")
def measured(home: Path) -> tuple[int, int, str]:
    """(the server's own memory, what one SmolLM2 costs, its greedy answer), measured by a
    server with room for all."""
    probe = _server(home)
    try:
        base = _rss(probe.proc.pid)
        first = _ask(probe, "smol-a")
        models = net.get(f"{probe.url}/api/ps", timeout=10).json()["models"]
        (cost,) = [m["size"] for m in models if m["name"] == "smol-a"]
    finally:
        probe.stop()
    return base, cost, first


def test_three_models_under_a_budget_for_two(home: Path, measured: tuple[int, int, str]) -> None:
    base, cost, first = measured
    budget = base + int(2.5 * cost)
    srv = _server(home, "--max-memory", str(budget))
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss(srv.proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        steps = [
            ("smol-a", {"smol-a"}),
            ("smol-b", {"smol-a", "smol-b"}),
            ("smol-c", {"smol-b", "smol-c"}),  # a was used least recently
            ("smol-b", {"smol-b", "smol-c"}),  # loaded: nothing moves
            ("smol-a", {"smol-b", "smol-a"}),  # c is now the least recently used
        ]
        after = []  # resident memory after each step
        for model, want in steps:
            assert _ask(srv, model) == first, model
            assert _loaded(srv) == {"mlp", *want}, model
            after.append(_rss(srv.proc.pid))
        assert "unloading smol-a to make room for smol-c" in srv.log()
        # `modelc ps` in the terminal: the same models, the command line's kept forever
        cmd = [sys.executable, "-m", "modelc.cli", "ps", "--url", srv.url]
        out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert set(rows) == {"mlp", "smol-a", "smol-b"} and "Forever" in rows["mlp"], out
        assert "minutes from now" in rows["smol-a"] and " 512 " in rows["smol-a"], out
        assert all(" CPU " in row for row in rows.values()), out  # no GPU: size_vram 0
        # an unloaded model's memory goes back: two loads later, still about two models
        one_model = after[1] - after[0]
        assert after[4] <= after[1] + one_model // 2, (after, one_model)
    finally:
        stop.set()
        sampler.join()
        srv.stop()
    assert peak[0] <= 1.1 * budget, (peak[0], budget)


def test_a_model_that_cannot_fit_is_a_clear_503(home: Path, measured: tuple[int, int, str]) -> None:
    base, cost, _ = measured
    srv = _server(home, "--max-memory", str(base + cost // 2))
    try:
        r = net.post(
            f"{srv.url}/v1/completions",
            json={"model": "smol-a", "prompt": "Hi", "max_tokens": 1},
            timeout=60,
        )
        assert r.status_code == 503, r.text
        assert "raise --max-memory" in r.json()["error"]["message"]
        assert _loaded(srv) == {"mlp"}  # and it goes on serving what it has
    finally:
        srv.stop()


def test_max_context_auto_fits_the_context_to_the_room(
    home: Path, measured: tuple[int, int, str]
) -> None:
    base, cost, first = measured
    # room for one SmolLM2 and about 3k tokens of KV beyond the probe's 2 x 512
    srv = start(SERVE[0], "--max-context", "auto", "--max-memory", str(base + cost), home=home)
    try:
        assert _ask(srv, "smol-a") == first
        (ctx,) = [
            m["context_length"]
            for m in net.get(f"{srv.url}/api/ps", timeout=10).json()["models"]
            if m["name"] == "smol-a"
        ]
        assert memory.MIN_CONTEXT < ctx < 8192, ctx  # fitted below the model's own 8192
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("budget", "verdict"),
    [
        ("64G", "fits: 8 sequences of its 8192 tokens at once"),
        ("700M", "KV budget fitted to"),
        ("300M", "does not fit"),
    ],
)
def test_inspect_fit_tells_what_modelc_run_would_do(home: Path, budget: str, verdict: str) -> None:
    env = {**os.environ, "MODELC_HOME": str(home)}
    cmd = [sys.executable, "-m", "modelc.cli", "inspect", "smol-a", "--fit", "--max-memory", budget]
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert "23.0 KB (f16)" in out.stdout  # 30 layers x 3 KV heads x 64 x K and V x 2 bytes
    assert verdict in out.stdout.splitlines()[-1], out.stdout
