"""`corral run MODEL` in a terminal (a pseudo-terminal driven by pexpect), and `corral pull`
through a running server (progress from its events; Ctrl-C cancels the server's download)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pexpect
import pytest

from store.conftest import small_gguf
from store.fake_hub import FakeHub
from ui.server import CorralServer, clean_env

pytestmark = pytest.mark.integration

PROMPT = ">>> "


def test_interactive_chat_in_a_terminal(server: CorralServer) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "corral.cli.main", "run", "default", "--port", str(server.port),
                                           "--max-tokens", "8", "--temperature", "0"],
                          env=clean_env(TERM="dumb", COLUMNS="120"), encoding="utf-8", timeout=120)
    try:
        child.expect("chatting with default")
        child.expect_exact(PROMPT)
        # a long answer, stopped with Ctrl-C while it streams: the program stays
        child.sendline("/set parameter max_tokens 4000")
        child.expect("set max_tokens to 4000")
        child.expect_exact(PROMPT)
        child.sendline("Count from 1 to 5000: 1, 2, 3, 4, 5, 6,")
        child.expect(r"\d\d, \d\d")  # the answer's own numbers (the echoed line has no two-digit ones)
        child.sendintr()
        child.expect("stopped")
        child.expect_exact(PROMPT)
        assert child.isalive()
        child.sendintr()  # Ctrl-C at the prompt does not leave either
        child.expect("/bye or Ctrl-D")
        child.expect_exact(PROMPT)
        child.sendline("/clear")
        child.expect("cleared the conversation")
        child.expect_exact(PROMPT)
        child.sendline("/set parameter max_tokens 8")
        child.expect("set max_tokens to 8")
        child.expect_exact(PROMPT)
        child.sendline("/set system You answer in one short sentence.")
        child.expect("set the system prompt")
        child.expect_exact(PROMPT)
        child.sendline("Hello there")
        child.expect(r"\d+ tokens")  # the answer streamed and ended (max 8 tokens)
        child.expect_exact(PROMPT)
        child.sendeof()  # Ctrl-D leaves
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    # the stopped answer's slot is free again
    with server.client() as c:
        deadline = time.monotonic() + 20
        while sum(i["slots"]["busy"] for m in c.get("/models").json()["data"] for i in m["instances"]):
            assert time.monotonic() < deadline, "Ctrl-C left the server's slot busy"
            time.sleep(0.1)  # nothing to await: /models is a snapshot


def test_bye_leaves(server: CorralServer) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "corral.cli.main", "run", "default", "--port", str(server.port)],
                          env=clean_env(TERM="dumb"), encoding="utf-8", timeout=120)
    try:
        child.expect_exact(PROMPT)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.fixture
def file_server() -> FakeHub:
    with FakeHub() as hub:
        yield hub


def test_pull_through_the_server_and_ctrl_c_cancels_it(server: CorralServer, file_server: FakeHub) -> None:
    f = file_server.add("plain/cli-pull-Q8_0.gguf", small_gguf(150_000, seed=3))
    r = subprocess.run([sys.executable, "-m", "corral.cli.main", "pull", f"{file_server.url}/plain/cli-pull-Q8_0.gguf",
                        "--port", str(server.port)], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pulled cli-pull-Q8_0" in r.stdout
    assert (server.models_dir / "cli-pull-Q8_0.gguf").exists()  # the server's models dir: it went through it
    assert f.gets >= 1
    slow = file_server.add("plain/cli-slow-Q8_0.gguf", small_gguf(3_000_000, seed=4))
    slow.behavior.bytes_per_s = 150_000
    proc = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "pull",
                             f"{file_server.url}/plain/cli-slow-Q8_0.gguf", "--port", str(server.port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        with server.client() as c:
            deadline = time.monotonic() + 60
            while True:
                ms = {m["id"]: m for m in c.get("/models").json()["data"]}
                m = ms.get("cli-slow-Q8_0")
                if m and m["status"]["value"] == "downloading" and (m["status"]["progress"] or {}).get("done"):
                    break
                assert time.monotonic() < deadline and proc.poll() is None, "the pull did not start"
                time.sleep(0.1)  # nothing to await from outside the CLI's process
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, err
            assert "cancelled cli-slow-Q8_0" in err
            m = next((x for x in c.get("/models").json()["data"] if x["id"] == "cli-slow-Q8_0"), None)
            assert m is None or m["status"]["value"] != "downloading"  # the server's download ended
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
