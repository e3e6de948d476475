"""The code's shape: import direction, no import circle, the type checker's settings."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "corral"


def _imported_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith('corral'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_cli_imports_nothing_of_the_control_plane() -> None:
    mods = _imported_after("import corral.cli.main, corral.cli.store_cmds")
    assert not {m for m in mods if m.startswith("corral.control")}


def test_wire_imports_only_its_own_modules_and_two_leaves() -> None:
    mods = _imported_after("import corral.wire")
    own = {m for m in mods if m.startswith("corral.wire.")}  # corral/wire/<topic>.py: its own types
    assert mods - own <= {"corral", "corral.wire", "corral.children", "corral.children.frames", "corral.model",
                          "corral.model.settings", "corral.units"}
    assert {"corral.wire.gpu", "corral.wire.editors", "corral.wire.model"} <= own


def test_the_top_level_is_three_leaves_and_its_rooms() -> None:
    entries = {p.name for p in SRC.iterdir() if p.name != "__pycache__"}
    assert {e for e in entries if e.endswith(".py")} == {"__init__.py", "errors.py", "events.py", "units.py"}
    rooms = {"config", "model", "state", "children"}  # the operator's files, a model, the disk, child plumbing
    assert {e for e in entries if not e.endswith(".py")} == rooms | {
        "wire", "fit", "api", "control", "worker", "store", "cli"}
    for room in rooms:  # a room's __init__ says what is in it and imports nothing
        init = (SRC / room / "__init__.py").read_text(encoding="utf-8")
        assert init.startswith('"""') and "import" not in init


def test_fit_imports_nothing_of_either_side() -> None:
    mods = _imported_after("import corral.fit.layout, corral.fit.plan, corral.fit.draft, corral.fit.rows, corral.fit.split")
    assert not {m for m in mods if m.startswith(("corral.control", "corral.worker", "corral.api"))}


def test_fetch_child_and_wire_share_one_frame_codec() -> None:
    from corral import wire
    from corral.children import frames
    from corral.store import messages

    assert issubclass(wire.FrameDecoder, frames.FrameDecoder)
    assert issubclass(messages.FrameReader, frames.FrameDecoder)
    assert wire.FrameTooLarge is frames.FrameTooLarge


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Package ``root``'s modules -> the modules of that package each imports. Every
    import counts: module-level, inside a function, under ``if TYPE_CHECKING:``;
    ``from a import b`` names module ``a.b`` when there is one, else ``a``."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    top = root.name
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        named: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                named += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        deps = set()
        for name in named:
            while name and name not in files:  # an attribute of a module, or not ours
                name = name.rpartition(".")[0]
            if name and name != mod and (name == top or name.startswith(top + ".")):
                deps.add(name)
        graph[mod] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_cycle_between_corral_modules() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 100 and graph["corral.control.plane"]  # it parsed the package
    cycles = import_cycles(graph)
    assert cycles == [], "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles)


def test_no_import_cycle_between_bench_modules() -> None:
    graph = import_graph(SRC.parents[1] / "bench")
    assert graph["bench.run"] and graph["bench.ray.run"]  # it parsed the package
    assert import_cycles(graph) == []


def test_the_cycle_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py", "leaf.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import C\n")  # function-level, relative
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nC = 1\n")
    (pkg / "d.py").write_text("from pkg import leaf\nimport os\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.leaf"}
    assert import_cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("C = 1\n")
    assert import_cycles(import_graph(pkg)) == []


def _top_imports(root: Path) -> dict[str, set[str]]:
    """Each file under ``root`` -> the top-level names it imports (any import, anywhere)."""
    out: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(root.parent))] = names
    return out


def test_bench_and_tests_share_testkit_and_import_not_each_other() -> None:
    repo = SRC.parents[1]
    bench = {f: n & {"tests", "support"} for f, n in _top_imports(repo / "bench").items()}
    kit = {f: n & {"tests", "support", "bench"} for f, n in _top_imports(repo / "testkit").items()}
    assert {f: n for f, n in bench.items() if n} == {} and {f: n for f, n in kit.items() if n} == {}
    bench_src = "\n".join(p.read_text(encoding="utf-8") for p in (repo / "bench").rglob("*.py"))
    assert "sys.path.insert" not in bench_src  # no reaching into another tree by path
    assert any("testkit" in n for n in _top_imports(repo / "bench").values())  # it did parse bench


# The worker's floors, lowest first: a module imports only modules of its own floor or a lower
# one (no arrow back up); every module of corral.worker is on exactly one (a new one must be placed).
WORKER_FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("failures", "host.*", "llama_context", "batch", "*.state", "lora", "speculation", "time_limit", "host")),
    ("model", ("model", "fit", "tokens")),
    ("parts", ("sampling*", "output*", "prompt*", "embed*", "reasoning", "reasoning.plan", "reasoning.split",
               "media", "media.prompt", "media.image", "media.audio", "media.projector", "media.mrope", "cache", "cache.kv_store")),
    ("slot", ("slots", "prefill")),
    ("features", ("intake", "reasoning.feature", "lora.adapters", "media.steps", "media.side", "cache.prompt_cache",
                  "cache.disk", "cache.slot_files", "speculation.*", "time_limit.feature", "preempt*")),
    ("engine", ("features", "engine")),
    ("process", ("process", "__main__")),
]


def worker_floor(module: str, floors: list[tuple[str, tuple[str, ...]]] = WORKER_FLOORS) -> int | None:
    """The floor of ``module`` (a name below ``corral.worker``): the first whose patterns match."""
    import fnmatch

    for i, (_, patterns) in enumerate(floors):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    return None


def upward_imports(graph: dict[str, set[str]], prefix: str) -> list[str]:
    """The imports inside package ``prefix`` that point to a higher floor, and its unplaced modules."""
    out = []
    inside = {m for m in graph if m.startswith(prefix + ".")}
    for mod in sorted(inside):
        low = worker_floor(mod[len(prefix) + 1:])
        if low is None:
            out.append(f"{mod}: on no floor (place it in WORKER_FLOORS)")
            continue
        for dep in sorted(graph[mod] & inside):
            up = worker_floor(dep[len(prefix) + 1:])
            if up is not None and up > low:
                out.append(f"{mod} ({WORKER_FLOORS[low][0]}) -> {dep} ({WORKER_FLOORS[up][0]})")
    return out


def test_the_worker_imports_only_down_its_floors() -> None:
    graph = import_graph(SRC)
    assert "corral.worker.engine" in graph and "corral.worker.media.steps" in graph
    assert upward_imports(graph, "corral.worker") == []


# the step's files that ask a prompt what it is (media/prompt.py) and never which media it holds:
# a new chunk kind (audio) lands in media/ and changes none of them (issue 42)
ASKS_THE_PROMPT = ("prefill", "preempt.urgent", "preempt.preemption", "intake", "speculation.speculator",
                   "cache.prompt_cache", "prompt.prompts", "slots")


def media_reaches(graph: dict[str, set[str]]) -> list[str]:
    """The imports of media/ by the step's files other than its prompt questions (media.prompt)."""
    return [f"{mod} -> {dep}" for mod in ASKS_THE_PROMPT for dep in sorted(graph[f"corral.worker.{mod}"])
            if dep.startswith("corral.worker.media") and dep != "corral.worker.media.prompt"]


def test_the_step_asks_the_prompt_and_names_no_modality() -> None:
    graph = import_graph(SRC)
    assert media_reaches(graph) == []
    graph["corral.worker.prefill"].add("corral.worker.media.image")  # e.g. prefill testing for an image
    assert media_reaches(graph) == ["prefill -> corral.worker.media.image"]


def test_an_arrow_back_up_the_worker_fails() -> None:
    graph = {k: set(v) for k, v in import_graph(SRC).items()}
    graph["corral.worker.slots"].add("corral.worker.engine")  # e.g. slot files reaching for the engine
    graph["corral.worker.newthing"] = set()
    assert upward_imports(graph, "corral.worker") == [
        "corral.worker.newthing: on no floor (place it in WORKER_FLOORS)",
        "corral.worker.slots (slot) -> corral.worker.engine (engine)"]
