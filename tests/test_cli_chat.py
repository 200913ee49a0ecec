"""``modelc chat``: the line protocol and commands (no model), then the real command in a
real terminal (tmux) against references: ``modelc generate --chat`` for a first turn
and a ``modelc run`` server's ``/v1/chat/completions`` for whole conversations."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from modelc.cli.chat_session import ChatState, Entry, read_entry, run_command
from modelc.runtime.prompt import SamplingDefaults
from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import ROOT, Server

TMUX = shutil.which("tmux") or "/usr/bin/tmux"
Q1 = "What is the capital of France? Answer briefly."
Q2 = "And Germany?"  # alone, not a question about capitals
MAX_TOKENS = 24


# --- the line protocol and the commands, no model ---------------------------------------------
def lines_of(*lines: str) -> Callable[[str], str]:
    """A read_line over ``lines`` that records its prompts in ``.prompts``."""
    it = iter(lines)
    prompts: list[str] = []

    def read_line(prompt: str) -> str:
        prompts.append(prompt)
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    read_line.prompts = prompts  # type: ignore[attr-defined]
    return read_line


@pytest.mark.parametrize(
    ("lines", "entry"),
    [
        (["hello there"], Entry("hello there")),
        (["   "], None),
        (["/bye"], Entry("/bye", command=True)),
        (['"""', "line one", "line two", '"""'], Entry("line one\nline two")),
        (['"""line one', '/not a command"""'], Entry("line one\n/not a command")),
        (['"""one line"""'], Entry("one line")),
        (['"""', "", "  indented", '"""'], Entry("\n  indented")),
        (["first \\", "second\\", "third"], Entry("first \nsecond\nthird")),
        (['"""', "unterminated"], Entry("unterminated")),  # end of input ends the block
    ],
)
def test_read_entry(lines: list[str], entry: Entry | None) -> None:
    read = lines_of(*lines)
    assert read_entry(read) == entry
    prompts = read.prompts  # type: ignore[attr-defined]
    assert prompts[: len(lines)] == [">>> "] + ["... "] * (len(lines) - 1)


def test_read_entry_raises_eof_at_the_prompt_only() -> None:
    with pytest.raises(EOFError):
        read_entry(lines_of())


def test_commands_change_the_state() -> None:
    d = SamplingDefaults.resolve({"temperature": 0.6})
    st = ChatState(system="Be brief.")
    st.add_turn("hi", "Hello!")
    assert [m["role"] for m in st.messages("next")] == ["system", "user", "assistant", "user"]

    def cmd(line: str) -> str:
        return run_command(line, st, d, 1000).text

    assert cmd("/set parameter temperature 0.2") == "Set parameter 'temperature' to '0.2'"
    assert cmd("/set parameter repeat_penalty 1.1").startswith("Set parameter")
    assert cmd("/set parameter num_predict 7").startswith("Set parameter")
    assert cmd("/set parameter seed 5").startswith("Set parameter")
    p = st.params(d)
    assert (p.temperature, p.repetition_penalty, p.max_tokens, p.seed) == (0.2, 1.1, 7, 5)
    assert p.top_k == 40  # the default where none was set
    for bad in ("top_p 0", "top_k 1.5", "temperature hot", "min_p nan", "nope 1"):
        assert cmd(f"/set parameter {bad}").startswith("Couldn't set parameter: ")
    assert st.params(d).top_p == 0.95  # a refused value changes nothing
    shown = cmd("/show parameters")
    assert re.search(r"^  temperature +0\.2 +\(set\)$", shown, re.M)
    assert re.search(r"^  top_k +40 +\(llama-server\)$", shown, re.M)
    assert re.search(r"^  num_predict +7 +\(set\)$", shown, re.M)
    assert cmd("/set parameter num_predict -1").startswith("Set parameter")
    assert st.max_tokens is None
    assert cmd("/set system You are a pirate.") == "Set system message."
    assert cmd("/show system") == "You are a pirate."
    assert cmd("/clear") == "Cleared session context"
    assert st.messages("x") == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "x"},
    ]
    assert "/set parameter" in cmd("/?") and cmd("/help") == cmd("/?")
    assert cmd("/frobnicate now") == "Unknown command '/frobnicate'. Type /? for help"
    assert cmd("/set").startswith("Usage: ") and cmd("/show").startswith("Usage: ")
    assert run_command("/bye", st, d, 1000).exit


# --- the real command ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-home")


@pytest.fixture(scope="module")
def env(home: Path) -> dict[str, str]:
    e = {**os.environ, "MODELC_HOME": str(home), "MODELC_THREADS": "1"}
    e.pop("MODELC_CONFIG", None)
    return e


def modelc(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelc.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def generate(question: str, env: dict[str, str], *flags: str) -> str:
    """What ``modelc generate --chat`` prints for one question."""
    gguf = str(smollm2_gguf())
    proc = modelc("generate", gguf, question, "--chat", *flags, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def first_answer(env: dict[str, str]) -> str:
    return generate(Q1, env, "--temperature", "0", "--max-tokens", str(MAX_TOKENS))


def served(server: Server, messages: list[dict[str, str]]) -> str:
    """The server's greedy answer to a conversation, at MAX_TOKENS."""
    r = net.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS},
        timeout=120,
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def tidy(text: str) -> str:
    """Text as a terminal shows it: no trailing blanks on a line, no trailing newlines."""
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


class Chat:
    """``modelc chat`` in a tmux pane of its own tmux server (socket ``-L``, no config);
    its exit status is written to ``rc_file``."""

    _ids = itertools.count()

    def __init__(self, env: dict[str, str], home: Path, *flags: str) -> None:
        n = next(self._ids)
        self.socket = f"modelc-chat-{os.getpid()}-{n}"
        self.rc_file = home / f"chat-rc-{n}"
        self.rc_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "modelc.cli", "chat", str(smollm2_gguf()), *flags]
        keep = {k: env[k] for k in ("MODELC_HOME", "MODELC_THREADS", "MODELC_CACHE") if k in env}
        line = " ".join(
            shlex.quote(c) for c in ["env", *(f"{k}={v}" for k, v in keep.items()), *cmd]
        )
        shell = f"cd {shlex.quote(str(ROOT))} && {line}; echo $? > {shlex.quote(str(self.rc_file))}"
        self.tmux("new-session", "-d", "-s", "chat", "-x", "200", "-y", "50", shell)
        self.tmux("set-option", "-t", "chat", "remain-on-exit", "on")  # its last words stay
        self.wait(lambda lines: bool(lines) and lines[-1] == ">>>", "the first prompt")

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            [TMUX, "-f", "/dev/null", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout

    def lines(self) -> list[str]:
        """The whole pane (history too), wrapped lines joined, trailing blanks dropped."""
        text = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat")
        return tidy(text).split("\n")

    def wait(self, done: Callable[[list[str]], bool], what: str, timeout: float = 120) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.lines()
            if done(lines):
                return lines
            if self.rc_file.exists():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {what} after {timeout}s; the pane:\n" + "\n".join(self.lines()))

    def type(self, *lines: str) -> None:
        for line in lines:
            self.tmux("send-keys", "-t", "chat", "-l", line)
            self.tmux("send-keys", "-t", "chat", "Enter")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "chat", *keys)

    def prompts(self, lines: list[str]) -> list[int]:
        return [i for i, s in enumerate(lines) if s == ">>>" or s.startswith(">>> ")]

    def ask(self, *lines: str) -> str:
        """Type ``lines`` (one entry) and return what was printed before the next prompt."""
        before = len(self.prompts(self.lines()))
        self.type(*lines)
        screen = self.wait(
            lambda ls: len(self.prompts(ls)) == before + 1 and ls[-1] == ">>>", "answer"
        )
        start = self.prompts(screen)[-2] + len(lines)  # the line after the entry
        out = screen[start:-1]
        return "\n".join(out).removesuffix("\n")  # an answer ends with a blank line

    def exit_status(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rc_file.exists() and self.rc_file.read_text().strip():
                return int(self.rc_file.read_text())
            time.sleep(0.05)
        raise AssertionError("modelc chat did not exit; the pane:\n" + "\n".join(self.lines()))

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def chat(env: dict[str, str], home: Path) -> Iterator[Callable[..., Chat]]:
    started: list[Chat] = []

    def start(*flags: str) -> Chat:
        c = Chat(env, home, *flags)
        started.append(c)
        return c

    yield start
    for c in started:
        c.close()


GREEDY = ("--temperature", "0", "--max-tokens", str(MAX_TOKENS))


@pytest.mark.slow
def test_turns_see_the_conversation(
    chat: Callable[..., Chat], first_answer: str, smol_server: Server
) -> None:
    c = chat(*GREEDY)
    a1 = c.ask(Q1)
    assert a1 == tidy(first_answer)  # the same engine path as `modelc generate --chat`
    a2 = c.ask(Q2)
    assert a2 == tidy(
        served(smol_server, [user(Q1), {"role": "assistant", "content": first_answer}, user(Q2)])
    )
    assert "Berlin" in a2 and a2 != tidy(served(smol_server, [user(Q2)]))  # it saw turn one
    assert c.ask("/clear") == "Cleared session context"
    assert c.ask(Q1) == a1  # a fresh conversation again
    c.type("/bye")
    assert c.exit_status() == 0


@pytest.mark.slow
def test_multiline_input_is_one_message(chat: Callable[..., Chat], smol_server: Server) -> None:
    c = chat(*GREEDY)
    want = tidy(served(smol_server, [user("Name three colors.\nOne per line, nothing else.")]))
    assert c.ask('"""', "Name three colors.", 'One per line, nothing else."""') == want
    c.ask("/clear")
    assert c.ask("Name three colors.\\", "One per line, nothing else.") == want


@pytest.mark.slow
def test_set_parameter_takes_effect(
    chat: Callable[..., Chat], env: dict[str, str], first_answer: str
) -> None:
    c = chat()  # the model's defaults: temperature 0.8
    shown = c.ask("/show parameters")
    assert re.search(r"^  temperature +0\.8 +\(llama-server\)$", shown, re.M), shown
    assert c.ask("/set parameter temperature 0") == "Set parameter 'temperature' to '0'"
    c.ask(f"/set parameter num_predict {MAX_TOKENS}")
    shown = c.ask("/show parameters")
    assert re.search(r"^  temperature +0 +\(set\)$", shown, re.M), shown
    assert re.search(rf"^  num_predict +{MAX_TOKENS} +\(set\)$", shown, re.M), shown
    assert c.ask(Q1) == tidy(first_answer)
    # a seed makes sampling repeatable, and equal to generate's with the same seed
    c.ask("/clear")
    for line in ("temperature 0.8", "seed 7", "top_k 20", "repeat_penalty 1.1"):
        assert c.ask(f"/set parameter {line}").startswith("Set parameter")
    flags = ("--temperature", "0.8", "--seed", "7", "--top-k", "20", "--repeat-penalty", "1.1")
    assert c.ask(Q1) == tidy(generate(Q1, env, *flags, "--max-tokens", str(MAX_TOKENS)))
    assert c.ask("/set parameter top_p 2").startswith("Couldn't set parameter: top_p")
    assert c.ask("/nope") == "Unknown command '/nope'. Type /? for help"


@pytest.mark.slow
def test_ctrl_c_stops_an_answer_and_hints_at_the_prompt(
    chat: Callable[..., Chat], first_answer: str, home: Path
) -> None:
    c = chat("--temperature", "0")  # no token limit: the story runs until stopped
    before = len(c.prompts(c.lines()))
    c.type("Write a very long story about a dragon, in ten chapters.")
    c.wait(lambda ls: len(ls) > 2 and ls[-1] != "" and not ls[-1].startswith(">>>"), "answer")
    time.sleep(0.5)
    c.keys("C-c")  # the whole story would take half a minute or more
    stopped = c.wait(
        lambda ls: len(c.prompts(ls)) == before + 1 and ls[-1] == ">>>", "prompt after ^C", 10
    )
    assert stopped[-2] == "", stopped  # the stopped answer ends its line, then a blank one
    c.keys("C-c")
    lines = c.wait(lambda ls: ls[-1] == ">>>" and "Use Ctrl + d or /bye to exit." in ls, "hint")
    assert lines[-2] == "Use Ctrl + d or /bye to exit."
    # the stopped turn was dropped: the next answer is a first answer
    c.ask(f"/set parameter num_predict {MAX_TOKENS}")
    assert c.ask(Q1) == tidy(first_answer)
    c.keys("C-d")
    assert c.exit_status() == 0
    assert Q1 in (home / "chat_history").read_text()  # readline's history was saved


@pytest.mark.slow
def test_piped_stdin_answers_and_exits(env: dict[str, str], first_answer: str) -> None:
    gguf = str(smollm2_gguf())
    proc = modelc("chat", gguf, *GREEDY, env=env, stdin=f"{Q1}\n")
    assert (proc.returncode, proc.stdout) == (0, first_answer + "\n"), proc.stderr
    lines = f"/show system\n{Q1}\n/bye\n{Q2}\n"  # nothing after /bye is read
    proc = modelc("chat", gguf, *GREEDY, env=env, stdin=lines)
    assert (proc.returncode, proc.stdout) == (
        0,
        f"No system message was specified.\n{first_answer}\n",
    )
    system = ("--system", "You answer in one word.")
    want = generate(Q1, env, *system, *GREEDY)
    proc = modelc("chat", gguf, *system, *GREEDY, env=env, stdin=f"{Q1}\n")
    assert (proc.returncode, proc.stdout) == (0, want + "\n"), proc.stderr


def test_errors_are_one_line(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4)
    for args in (
        ["chat", str(bad)],
        ["chat", str(tmp_path / "missing.gguf")],
        ["chat", str(bad), "--max-tokens", "-1"],
    ):
        proc = modelc(*args, env=env, stdin="hi\n")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("modelc: error:") and proc.stderr.count("\n") == 1, (
            proc.stderr
        )
