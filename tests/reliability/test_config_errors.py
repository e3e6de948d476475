"""Config files written wrong: a clear error naming file, table and key; never a traceback
at start, never a 500 or a dead task on reload."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.config.file import load_config
from corral.errors import ConfigError
from support.harness import FAKE, Harness


def write(tmp_path: Path, text: bytes | str) -> Path:
    p = tmp_path / "corral.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


@pytest.mark.parametrize(("text", "words"), [
    (b'[server]\nport = 8080\n# caf\xe9\n', ["corral.toml", "line 3", "UTF-8"]),
    ('server = "x"\n', ["corral.toml", "'server'", "table"]),
    ('models = 3\n', ["corral.toml", "'models'", "table"]),
    ('[server]\nmax_queue = true\n', ["corral.toml", "[server] key 'max_queue'", "integer", "true"]),
    ('[server]\nqueue_timeout_s = false\n', ["[server] key 'queue_timeout_s'", "number"]),
    ('[server]\nautoload = true\nmax_loaded_models = 2\n', None),
])
def test_config_errors_name_file_table_and_key(tmp_path: Path, text: bytes | str,
                                               words: list[str] | None) -> None:
    path = write(tmp_path, text)
    if words is None:
        assert load_config(path).server.max_loaded_models == 2
        return
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    for w in words:
        assert w in ei.value.message, (w, ei.value.message)
    # a server override from the command line does not hide it either
    with pytest.raises(ConfigError):
        load_config(path, server_overrides={"port": 9000, "host": None})


def test_model_path_that_is_a_directory_or_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.gguf").write_text("hello")
    for target, words in (("adir", "is a directory"), ("notes.gguf", "not a GGUF model file")):
        path = write(tmp_path, f'[models."m.1"]\npath = "{target}"\n')
        with pytest.raises(ConfigError) as ei:
            load_config(path)
        msg = ei.value.message
        assert str(path) in msg and "[models.\"m.1\"] key 'path'" in msg and words in msg, msg


def test_invalid_utf8_config_at_start_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, b"[server]\nport = 8080\n\xff\xfe\n")
    r = subprocess.run([sys.executable, "-m", "corral.cli.main", "serve", "-c", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "not valid UTF-8" in r.stderr and str(path) in r.stderr


class LogLine(logging.Handler):
    """An event for the first record on a logger whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.ERROR)
        self.text = text
        self.message = ""
        self.seen = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage() and not self.message:
            self.message = record.getMessage()
            self._loop.call_soon_threadsafe(self.seen.set)


async def test_bad_reload_changes_nothing(harness: Harness, tmp_path: Path) -> None:
    script = harness.script("a")
    good = (f'[server]\nworker_command = ["{sys.executable}", "{FAKE}"]\ninclude_default_model = false\n'
            f'[models.a]\npath = "{script}"\n')
    path = write(tmp_path, good)
    await harness.start(load_config(path), loader=lambda: load_config(path), sighup=True)
    c = harness.client
    loop_errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: loop_errors.append(ctx))
    for bad in (good.encode() + b"\n# \xff\n", ('server = "x"\n' + good.split("\n", 3)[3]).encode(),
                good.replace("include_default_model = false", "max_queue = true").encode()):
        path.write_bytes(bad)
        r = await c.post("/models/reload")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_config", r.text
        assert str(path) in r.json()["error"]["message"]
        line = LogLine("SIGHUP reload failed")
        plane_log = logging.getLogger("corral.plane")  # ControlPlane.reload_soon logs the outcome
        plane_log.addHandler(line)
        try:
            os.kill(os.getpid(), signal.SIGHUP)  # the handler runs on this loop
            await asyncio.wait_for(line.seen.wait(), 10)
        finally:
            plane_log.removeHandler(line)
        assert "SIGHUP reload failed, nothing changed" in line.message and str(path) in line.message
    assert loop_errors == []
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "x"})
    assert r.status_code == 200, r.text
