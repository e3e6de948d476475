"""The code's shape: module size, import direction, the type checker's settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"


def test_no_module_over_400_lines() -> None:
    big = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert big == {}


def _imported_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith('corral'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_cli_imports_nothing_of_the_control_plane() -> None:
    mods = _imported_after("import corral.cli.main, corral.cli.store_cmds")
    assert not {m for m in mods if m.startswith("corral.control")}


def test_wire_imports_only_its_leaf_modules() -> None:
    mods = _imported_after("import corral.wire")
    assert mods <= {"corral", "corral.wire", "corral.wire_gpu", "corral.wire_editors", "corral.frames", "corral.settings"}


def test_fetch_child_and_wire_share_one_frame_codec() -> None:
    from corral import frames, wire
    from corral.store import messages

    assert issubclass(wire.FrameDecoder, frames.FrameDecoder)
    assert issubclass(messages.FrameReader, frames.FrameDecoder)
    assert wire.FrameTooLarge is frames.FrameTooLarge
