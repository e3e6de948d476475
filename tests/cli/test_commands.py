"""`corral ps/ls/load/unload/show/run` against a real server, and without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.cli.client import server_url
from support.serve_process import free_port
from ui.server import CorralServer

from .run import corral

pytestmark = pytest.mark.integration

DEFAULT = "gemma-3-270m"


@pytest.mark.parametrize("args", [["ps"], ["load", "default"], ["unload", "default"], ["show", "default"],
                                  ["run", "default", "hi"], ["ps", "--json"]])
def test_no_server_is_one_line_and_exit_1(args: list[str]) -> None:
    port = str(free_port())
    r = corral(*args, "--port", port)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert f"no server answers at http://127.0.0.1:{port}" in lines[0]
    assert "corral serve" in lines[0]


@pytest.mark.parametrize(("args", "want"), [
    (["--cache-type-v", "q8_0", "--flash-attn", "off"], "corral serve: <command line>: cache_type_v: q8_0 (a "
     "quantized V cache) needs flash attention: leave flash_attn unset or set it to true"),
    (["-ctk", "q3"], "key 'cache_type_k' at top level: Invalid enum value 'q3' (allowed: f16, f32, bf16, q8_0"),
    (["-fa", "maybe"], "corral serve: --flash-attn takes on, off or auto, not 'maybe'"),
])
def test_serve_refuses_bad_cache_and_attention_options(args: list[str], want: str) -> None:
    r = corral("serve", "--port", str(free_port()), *args, timeout=60)
    assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_with_a_q8_0_kv_cache_as_llama_server_flags_say(tmp_path: Path) -> None:
    srv = CorralServer(tmp_path, args=("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--swa-full"))
    try:
        p = ("--port", str(srv.port))
        r = corral("run", "default", "One, two, three,", "--max-tokens", "4", *p)
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
        (m,) = json.loads(corral("ps", "--json", *p).stdout)
        assert m["settings"]["swa_full"] is True  # --swa-full (a slot of 1024 cells is one window: same KV)
        [host] = m["instances"][0]["placement"]
        # 2048 cells over 2 slots; 18 layers (3 full, 15 with a 512 + 512 cell window, all 1024 here),
        # each cell one 256-wide K and V head: 8 q8_0 blocks of 34 bytes each
        assert host["kv_bytes"] == 18 * 2048 * 2 * 8 * 34
        assert abs(m["instances"][0]["memory"]["kv_bytes"] - host["kv_bytes"]) < 16 * 1024  # llama.cpp's own
    finally:
        srv.stop()


def test_server_address_from_options_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("CORRAL_HOST", "CORRAL_SERVER"):
        monkeypatch.delenv(k, raising=False)
    assert server_url() == "http://127.0.0.1:8080"
    assert server_url("10.0.0.2", 9000) == "http://10.0.0.2:9000"
    assert server_url("10.0.0.2:9001") == "http://10.0.0.2:9001"
    assert server_url("https://example.test:443/") == "https://example.test:443"
    assert server_url("[::1]:9002") == "http://[::1]:9002"
    assert server_url("0.0.0.0") == "http://127.0.0.1:8080"
    monkeypatch.setenv("CORRAL_HOST", "127.0.0.1:9003")
    assert server_url() == "http://127.0.0.1:9003"
    assert server_url(port=9004) == "http://127.0.0.1:9004"
    assert server_url(server="http://h:1/") == "http://h:1"


def test_processor_says_where_an_instance_runs_as_ollama_ps_does() -> None:
    from corral.cli.model_cmds import processor

    def part(device: str, weights: int, kv: int = 0, compute: int = 0, inputs: int = 0) -> dict[str, object]:
        return {"device": device, "first_layer": 0, "layers": 1, "output": False, "weight_bytes": weights,
                "kv_bytes": kv, "compute_bytes": compute, "input_bytes": inputs}

    assert processor([]) == "-"
    assert processor([part("CPU", 300, 20)]) == "100% CPU"
    assert processor([part("CUDA0", 250, 40, 10), part("CPU", 170, inputs=170)]) == "100% GPU"  # embeddings only
    assert processor([part("CUDA0", 150, 10, 40), part("CUDA1", 100), part("CPU", 150, inputs=50)]) == "25%/75% CPU/GPU"
    assert processor([part("CUDA0", 700), part("CPU", 100)]) == "13%/87% CPU/GPU"  # halves up, as Go's math.Round


def test_load_ps_show_ls_unload(server: CorralServer) -> None:
    p = ("--port", str(server.port))
    r = corral("ps", *p)
    assert r.returncode == 0 and "no model is loaded" in r.stdout
    r = corral("load", "default", *p)
    assert r.returncode == 0 and "loaded default" in r.stdout, r.stderr
    r = corral("ps", *p)
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if DEFAULT in ln)
    assert "#0" in row and "ready" in row and "0/2" in row and "MiB" in row and "never" in row
    assert "100% CPU" in row  # no GPU here: everything on the host
    for word in ("MODEL", "SLOTS", "MEMORY", "PROCESSOR", "UNTIL"):
        assert word in r.stdout
    r = corral("ps", "--json", *p)
    (m,) = json.loads(r.stdout)
    assert m["id"] == DEFAULT and m["instances"][0]["state"] == "ready"
    r = corral("show", "default", *p)
    assert r.returncode == 0, r.stderr
    for want in ("gemma3", "Q4_K_M", "32768", "268.1M", "chat template", "none"):
        assert want in r.stdout, want
    info = json.loads(corral("show", DEFAULT, "--json", *p).stdout)
    assert info["architecture"] == "gemma3" and info["context_length"] == 32768
    assert info["quantization"] == "Q4_K_M" and info["parameters"] > 200_000_000
    r = corral("show", "no-such-model", *p)
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr
    rows = json.loads(corral("ls", "--json", "--models-dir", str(server.models_dir), *p).stdout)
    (row,) = [x for x in rows if x["id"] == DEFAULT]
    assert row["loaded"] is True and row["status"] == "loaded"
    r = corral("ls", "--models-dir", str(server.models_dir), *p)
    assert "loaded" in next(ln for ln in r.stdout.splitlines() if DEFAULT in ln)
    r = corral("unload", DEFAULT, *p)
    assert r.returncode == 0 and "unloaded" in r.stdout
    assert json.loads(corral("ps", "--json", *p).stdout) == [] or all(
        i["state"] != "ready" for m in json.loads(corral("ps", "--json", *p).stdout) for i in m["instances"])
    rows = json.loads(corral("ls", "--json", "--models-dir", str(server.models_dir), *p).stdout)
    assert [x["loaded"] for x in rows if x["id"] == DEFAULT] == [False]


def test_run_one_shot_with_prompt_and_stdin(server: CorralServer) -> None:
    env = {"CORRAL_HOST": f"127.0.0.1:{server.port}"}
    r = corral("run", "default", "The capital of France is", "--max-tokens", "8", "--verbose", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "tokens/s" in r.stderr and "first token" in r.stderr
    r = corral("run", "default", "--max-tokens", "8", stdin="Once upon a time", env=env)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = corral("run", "no-such-model", "hi", env=env)
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_chat_keeps_history_and_system_prompt(server: CorralServer, capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli.client import Api
    from corral.cli.run_cmd import Chat

    with Api(server.url, timeout=None) as api:
        chat = Chat(api, "default", options={"max_tokens": 6, "temperature": 0})
        assert chat.command("/set system Answer briefly.")
        first = chat.ask("Hello")
        assert first.text and not first.stopped and first.tokens > 0
        chat.ask("And then?")
        assert [m["role"] for m in chat.history] == ["user", "assistant", "user", "assistant"]
        assert chat.messages("x")[0] == {"role": "system", "content": "Answer briefly."}
        assert chat.command("/clear") and chat.history == []
        assert chat.command("/set parameter max_tokens 9") and chat.options["max_tokens"] == 9
        assert not chat.command("/bye")
    assert first.text in capsys.readouterr().out  # streamed to stdout as it came


def test_api_key_from_the_environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = CorralServer(tmp_path_factory.mktemp("keyed"), api_key="cli-key-42")
    try:
        p = ("--port", str(srv.port))
        r = corral("ps", *p)
        assert r.returncode == 1 and "API key" in r.stderr and "CORRAL_API_KEY" in r.stderr
        assert "Traceback" not in r.stderr
        r = corral("ps", *p, env={"CORRAL_API_KEY": "cli-key-42"})
        assert r.returncode == 0 and "no model is loaded" in r.stdout, r.stderr
    finally:
        srv.stop()
