"""The docs say what the code is: docs/architecture.md stays short, names only modules
and tests that exist and names every package and internals page, docs/benchmarks.md's index
lists every dated log, the links of README and of the user guide (docs/guide/) lead somewhere, and the three drawings in docstrings
(the exception tree in corral/errors.py, the event list in corral/events.py, the
conversation in corral/wire/__init__.py) match the classes, events and frames in the code. Each checker is also run on a made-up mismatch, so a
class or an event added without its drawing is caught."""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from corral import errors, events

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
ARCHITECTURE_MAX_BYTES = 30_000

# The docs whose paths and module names must be current. The dated logs under
# docs/benchmarks/ are records of a past run and keep the names they were written with.
CURRENT_DOCS = [ARCHITECTURE, DOCS / "benchmarks.md",
                *sorted((DOCS / "internals").glob("*.md")),
                *sorted((DOCS / "decisions").glob("*.md"))]

# Dotted names in the docs that start with "corral." but are not Python.
NOT_MODULES = {"corral.apiKey"}  # the web page's localStorage key

_PATH = re.compile(r"(?<![\w./-])((?:src|tests|docs|testkit)/[\w./-]*[\w/])(?:::(\w+))?")
_MODULE = re.compile(r"(?<![\w./-])corral(?:\.[A-Za-z_]\w*)+")
_SHORT_PY = re.compile(r"`((?:[\w]+/)+[\w]+\.py)(?:::\w+)?`")


# ----------------------------------------------------------------- paths and modules

def _names_defined(path: Path) -> set[str]:
    """Every name a module file defines at any depth (functions, classes, assignments,
    imports): enough to say that ``corral.x.Name`` or ``tests/x.py::test_y`` is there."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _module_file(dotted: str) -> Path | None:
    base = SRC / Path(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_module(dotted: str) -> str | None:
    """Why ``corral.a.b[.Name[.attr]]`` names nothing, or None when it does: the longest
    module prefix must exist and the next part must be a name that module defines."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        found = _module_file(".".join(parts[:n]))
        if found is None:
            continue
        if n == len(parts) or parts[n] in _names_defined(found):
            return None
        return f"{dotted}: {'.'.join(parts[:n])} defines no {parts[n]}"
    return f"{dotted}: no such module"


def missing_path(path: str, name: str | None) -> str | None:
    target = ROOT / path
    if not target.exists():
        return f"{path}: no such file or directory"
    if name is not None and target.is_file() and name not in _names_defined(target):
        return f"{path}::{name}: not defined there"
    return None


def stale_names(text: str) -> list[str]:
    """Every ``src/``, ``tests/``, ``docs/`` path, ``corral.x`` module and backticked
    ``package/module.py`` (under src/corral) a text names that does not exist."""
    problems = []
    for m in _PATH.finditer(text):
        if (why := missing_path(m.group(1), m.group(2))) is not None:
            problems.append(why)
    for m in _MODULE.finditer(text):
        if m.group(0) not in NOT_MODULES and (why := missing_module(m.group(0))) is not None:
            problems.append(why)
    for m in _SHORT_PY.finditer(text):
        short = m.group(1)
        if short.split("/")[0] in {"src", "tests", "docs", "bench", "testkit"}:
            continue  # checked above (bench/ is being reorganised and is not checked)
        if not (SRC / "corral" / short).is_file() and not (SRC / short).is_file():
            problems.append(f"{short}: not under src/corral/")
    return sorted(set(problems))


def test_architecture_is_short() -> None:
    size = ARCHITECTURE.stat().st_size
    assert size <= ARCHITECTURE_MAX_BYTES, (
        f"docs/architecture.md is {size} bytes; keep it under {ARCHITECTURE_MAX_BYTES} "
        "and move details to docs/internals/")


@pytest.mark.parametrize("doc", CURRENT_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_what_exists(doc: Path) -> None:
    assert stale_names(doc.read_text(encoding="utf-8")) == []


def test_architecture_names_the_modules_and_tests_of_every_part() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    parts = re.split(r"^### ", text.split("\n## The parts\n", 1)[1], flags=re.MULTILINE)[1:]
    assert len(parts) >= 10
    for part in parts:
        title = part.splitlines()[0]
        assert re.search(r"(?<![\w./-])tests/\S+\.py", part), f"{title}: names no test"
        assert _MODULE.search(part) or "src/corral/" in part, f"{title}: names no module"


def test_code_points_only_at_docs_that_exist() -> None:
    named = {(str(f.relative_to(ROOT)), m[0]) for f in [*SRC.rglob("*.py"), ROOT / "Makefile"]
             for m in re.finditer(r"(?<![\w./-])docs/[\w./-]*\w", f.read_text(encoding="utf-8"))}
    assert named  # the code does point at its docs
    assert sorted((f, d) for f, d in named if not (ROOT / d).exists()) == []


# Backticked ``word.attr`` in the code's text whose first word is not a module of corral
# but the name of a request field or another library.
NOT_CORRAL_MODULES = {"llama_cpp", "response_format", "context_management", "output_config",
                      "chat_template_kwargs", "stream_options"}
_BARE_PY = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
_TICKED_DOTTED = re.compile(r"`([a-z][a-z0-9]*_[a-z0-9_]*)\.(?!py\b)[A-Za-z_]\w*")


def _code_texts(path: Path) -> list[str]:
    """A module's docstrings and comments: where code names the modules it works with."""
    import io
    import tokenize

    text = path.read_text(encoding="utf-8")
    texts = [doc for node in ast.walk(ast.parse(text))
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
             and (doc := ast.get_docstring(node))]
    texts += [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return texts


def stale_code_names(path: Path) -> list[str]:
    """What a module's docstrings and comments name that does not exist: the docs' checks
    (paths, ``corral.x`` names), every ``x.py`` or ``folder/x.py`` (some module of corral's
    path ends so, or the repository has it), and backticked ``some_module.Name`` where no
    module of corral is called ``some_module``."""
    corral_dir = SRC / "corral"
    files = [p.relative_to(corral_dir).as_posix() for p in corral_dir.rglob("*.py")]
    stems = {p.stem for p in corral_dir.rglob("*.py")} | {p.name for p in corral_dir.rglob("*") if p.is_dir()}
    problems = []
    for text in _code_texts(path):
        problems += stale_names(text)
        for m in _BARE_PY.finditer(text):
            name = m.group(1).lstrip("./").removeprefix("corral/")
            if name.split("/")[0] in {"src", "tests", "docs", "bench", "testkit"} or (ROOT / name).is_file():
                continue  # a path from the root: stale_names checked it
            if not any(f == name or f.endswith("/" + name) for f in files):
                problems.append(f"{name}: no such module in corral")
        for m in _TICKED_DOTTED.finditer(text):
            if m.group(1) not in stems and m.group(1) not in NOT_CORRAL_MODULES:
                problems.append(f"{m.group(0)[1:]}: no module {m.group(1)} in corral")
    return sorted(set(problems))


def test_the_codes_docstrings_and_comments_name_only_what_exists() -> None:
    found = {str(p.relative_to(SRC)): why for p in sorted((SRC / "corral").rglob("*.py"))
             if (why := stale_code_names(p))}
    assert found == {}


def test_the_code_name_check_can_fail(tmp_path: Path) -> None:
    fake = tmp_path / "steps.py"
    fake.write_text('"""Cut from vision_side.py (`vision_side.ImageThreads`); beside ../slots.py,\n'
                    'worker/no_such.py and corral.worker.nothing."""\n# `cache_files.CacheFileError`\n',
                    encoding="utf-8")
    assert stale_code_names(fake) == [
        "corral.worker.nothing: corral.worker defines no nothing",
        "vision_side.ImageThreads: no module vision_side in corral",
        "vision_side.py: no such module in corral",
        "worker/no_such.py: no such module in corral"]


def test_the_name_check_can_fail() -> None:
    text = ("`src/corral/control/link.py`, tests/router/test_api.py, corral.cluster.local, "
            "corral.wire.NoSuchMessage, `control/ray_link.py`, "
            "tests/control/test_lifecycle.py::test_not_there, docs/internals/none.md")
    assert stale_names(text) == sorted([
        "src/corral/control/link.py: no such file or directory",
        "tests/router/test_api.py: no such file or directory",
        "corral.cluster.local: corral defines no cluster",
        "corral.wire.NoSuchMessage: corral.wire defines no NoSuchMessage",
        "control/ray_link.py: not under src/corral/",
        "tests/control/test_lifecycle.py::test_not_there: not defined there",
        "docs/internals/none.md: no such file or directory",
    ])
    assert stale_names("src/corral/control/transport/link.py, corral.wire.GenerateRequest, "
                       "tests/control/test_lifecycle.py, `worker/engine.py`") == []


_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)|<img src=\"([^\"]+)\"")


def _anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes of a markdown file's headings."""
    heads = re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def broken_links(doc: Path) -> list[str]:
    """Links of a markdown file to files (and headings) that are not there."""
    broken = []
    for path, anchor, img in _LINK.findall(doc.read_text(encoding="utf-8")):
        target = path or img
        if "://" in target or target.startswith("mailto:"):
            continue
        file = (doc.parent / target) if target else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}#{anchor}")
    return broken


def test_readme_links_lead_to_files() -> None:
    readme = ROOT / "README.md"
    local = {m[0] for m in _LINK.findall(readme.read_text(encoding="utf-8"))}
    assert {"docs/architecture.md", "docs/benchmarks.md", "docs/guide/index.md"} <= local
    assert broken_links(readme) == []


def test_docs_links_lead_to_files() -> None:
    guide = sorted((DOCS / "guide").glob("*.md"))
    assert len(guide) >= 10
    docs = [*CURRENT_DOCS, *sorted((DOCS / "benchmarks").glob("*.md")), *guide]
    assert {str(d.relative_to(ROOT)): broken_links(d) for d in docs} == {
        str(d.relative_to(ROOT)): [] for d in docs}


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A title\n\n## `code` and more\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text("[x](a.md#a-title) [y](a.md#code-and-more) [z](a.md#gone) [w](none.md) "
                   "[v](https://example.com/x)", encoding="utf-8")
    assert broken_links(doc) == ["a.md#gone", "none.md"]


# ----------------------------------------------------------------- complete lists

# The packages docs/architecture.md must name: every directory with an __init__.py under these.
PACKAGE_ROOTS = [SRC / "corral", ROOT / "testkit", ROOT / "bench"]
BENCHMARKS = DOCS / "benchmarks.md"


def packages(roots: Iterable[Path]) -> list[str]:
    """The dotted name of every package (a directory with an ``__init__.py``) under the roots,
    each root included (``corral``, ``corral.api.core``, ``bench.gpu``)."""
    return [".".join(init.parent.relative_to(root.parent).parts)
            for root in roots for init in sorted(root.rglob("__init__.py"))]


def unnamed_packages(text: str, names: Iterable[str]) -> list[str]:
    """The packages a text names neither by dotted name (alone or as the start of a module's:
    ``corral.api.core.dialect`` names ``corral.api.core``) nor by path (``bench/gpu/``)."""
    return [n for n in names
            if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text)
            and n.replace(".", "/") + "/" not in text]


def unnamed_pages(text: str, pages: Iterable[Path]) -> list[str]:
    """The pages (``internals/x.md``) a text does not name by their path in docs/."""
    return [name for page in pages
            if (name := f"{page.parent.name}/{page.name}") not in text]


def unlisted_logs(text: str, logs: Iterable[Path]) -> list[str]:
    """The dated logs that the "Dated logs" section of docs/benchmarks.md does not link."""
    index = text.split("\n## Dated logs\n", 1)[1] if "\n## Dated logs\n" in text else ""
    index = re.split(r"^## ", index, flags=re.MULTILINE)[0]
    return [log.name for log in logs if f"(benchmarks/{log.name})" not in index]


def test_architecture_names_every_package_and_internals_page() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    names = packages(PACKAGE_ROOTS)
    assert {"corral", "corral.api.core", "corral.control.transport.ray", "testkit",
            "bench.gpu"} <= set(names)
    assert unnamed_packages(text, names) == []
    pages = sorted((DOCS / "internals").glob("*.md"))
    assert len(pages) >= 10
    assert unnamed_pages(text, pages) == []


def test_benchmarks_index_lists_every_dated_log() -> None:
    logs = sorted((DOCS / "benchmarks").glob("*.md"))
    assert len(logs) >= 10
    assert unlisted_logs(BENCHMARKS.read_text(encoding="utf-8"), logs) == []


def test_the_completeness_checks_can_fail(tmp_path: Path) -> None:
    for d in ["pkg", "pkg/sub", "pkg/sub/deeper", "pkg/data"]:
        (tmp_path / d).mkdir()
    for d in ["pkg", "pkg/sub", "pkg/sub/deeper"]:
        (tmp_path / d / "__init__.py").write_text("", encoding="utf-8")
    names = packages([tmp_path / "pkg"])
    assert names == ["pkg", "pkg.sub", "pkg.sub.deeper"]  # pkg/data has no __init__.py
    assert unnamed_packages("`pkg.sub.mod`", names) == ["pkg.sub.deeper"]
    assert unnamed_packages("pkg.sub, pkg/sub/deeper/", names) == []

    text = ARCHITECTURE.read_text(encoding="utf-8")
    without = text.replace("bench.gpu", "bench.GPU").replace("bench/gpu/", "bench/GPU/")
    assert without != text
    assert unnamed_packages(without, packages(PACKAGE_ROOTS)) == ["bench.gpu"]
    pages = sorted((DOCS / "internals").glob("*.md"))
    assert unnamed_pages(text.replace("internals/clients.md", "internals/"), pages) == [
        "internals/clients.md"]

    index = BENCHMARKS.read_text(encoding="utf-8")
    logs = sorted((DOCS / "benchmarks").glob("*.md"))
    dropped = re.sub(r"^- \[2026-11-30-soak\.md\]\(benchmarks/2026-11-30-soak\.md\).*\n", "",
                     index, flags=re.MULTILINE)
    assert dropped != index
    assert unlisted_logs(dropped, logs) == ["2026-11-30-soak.md"]
    assert unlisted_logs(index + "\n## After\n", [*logs, tmp_path / "2099-01-01-x.md"]) == [
        "2099-01-01-x.md"]


# ----------------------------------------------------------------- the exception tree

_TREE_LINE = re.compile(r"^(?P<lead>[ │├└─]*?)(?P<name>[A-Z]\w+)\s+(?P<rest>.*)$")


def drawn_tree(doc: str) -> list[tuple[str, str | None, str]]:
    """(class, parent, the rest of its line) for each line of the drawn tree."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("CorralError"))
    root_col = lines[start].index("CorralError")
    drawn: list[tuple[str, str | None, str]] = []
    stack: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            break
        m = _TREE_LINE.match(line)
        assert m is not None, f"not a line of the tree: {line!r}"
        depth = (m.start("name") - root_col) // 4
        del stack[depth:]
        drawn.append((m["name"], stack[-1] if stack else None, m["rest"]))
        stack.append(m["name"])
    return drawn


def tree_problems(doc: str, classes: Mapping[str, type[errors.CorralError]],
                  exported: Iterable[str]) -> list[str]:
    drawn = drawn_tree(doc)
    problems = []
    names = [name for name, _, _ in drawn]
    problems += [f"{n} is drawn twice" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"{n} is drawn but not defined" for n in sorted(set(names) - set(classes))]
    problems += [f"{n} is not in the drawing" for n in sorted(set(classes) - set(names))]
    problems += [f"{n} is not in __all__" for n in sorted(set(classes) - set(exported))]
    for name, parent, rest in drawn:
        cls = classes.get(name)
        if cls is None:
            continue
        base = cls.__bases__[0].__name__ if cls is not errors.CorralError else None
        if base != parent:
            problems.append(f"{name} is drawn under {parent}, but its base is {base}")
        status = re.match(r"(\d{3})\b", rest)
        if status and int(status[1]) != cls.status:
            problems.append(f"{name} is drawn as {status[1]}, but its status is {cls.status}")
        code = re.search(r"\bcode=(\w+)", rest)
        if code and code[1] != cls.code:
            problems.append(f"{name} is drawn with code={code[1]}, but its code is {cls.code}")
    return problems


def _error_classes(namespace: Mapping[str, object]) -> dict[str, type[errors.CorralError]]:
    return {name: obj for name, obj in namespace.items()
            if isinstance(obj, type) and issubclass(obj, errors.CorralError)
            and obj.__module__ == errors.__name__}


def test_the_exception_tree_is_drawn_as_it_is() -> None:
    assert errors.__doc__ is not None
    assert tree_problems(errors.__doc__, _error_classes(vars(errors)), errors.__all__) == []


def _every_subclass(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_every_subclass(direct)}}


def test_every_corral_error_in_src_is_in_the_drawn_tree() -> None:
    """Every module of src/corral imported, every subclass of CorralError anywhere in it is
    one of corral.errors' own (and so drawn): an error class declared in another module
    (as api/guard.py's UnsupportedMediaType was) is outside the tree the test above reads."""
    import importlib
    import pkgutil

    import corral

    for info in pkgutil.walk_packages(corral.__path__, "corral."):
        importlib.import_module(info.name)
    outside = sorted(f"{c.__module__}.{c.__qualname__}" for c in _every_subclass(errors.CorralError)
                     if c.__module__.startswith("corral.") and c.__module__ != errors.__name__)
    assert outside == []


def test_an_undrawn_or_misdrawn_exception_is_caught() -> None:
    assert errors.__doc__ is not None
    classes = _error_classes(vars(errors))

    class ModelEvicted(errors.Unavailable):
        code = "model_evicted"

    ModelEvicted.__module__ = errors.__name__
    found = tree_problems(errors.__doc__, {**classes, "ModelEvicted": ModelEvicted},
                          [*errors.__all__, "ModelEvicted"])
    assert found == ["ModelEvicted is not in the drawing"]

    moved = errors.__doc__.replace("    │   ├── QueueFull                503",
                                   "    │   │   └── QueueFull            504")
    assert moved != errors.__doc__
    assert tree_problems(moved, classes, errors.__all__) == [
        "QueueFull is drawn under ModelUnloaded, but its base is Unavailable",
        "QueueFull is drawn as 504, but its status is 503",
    ]


# ----------------------------------------------------------------- the event list

def drawn_events(doc: str) -> dict[str, set[str]]:
    """Each event the docstring lists under "Names", with the fields drawn after it
    (words in parentheses are comments, not fields)."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Names ("))
    drawn: dict[str, set[str]] = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        m = re.match(r"^    ([a-z_]+)(.*)$", line)
        if m is None:
            continue  # a continuation line (more indented): a comment on the event above
        rest = re.sub(r"\([^)]*\)", "", m[2])
        drawn[m[1]] = set(re.findall(r"[a-z_][a-z0-9_]*", rest))
    return drawn


def _literal_keys(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg for k in node.keywords if k.arg is not None}
    return set()


def _keys_of_local(func: ast.AST, name: str) -> set[str]:
    """String keys a function puts in its local dict ``name``."""
    keys: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id == name and node.value is not None:
                    keys |= _literal_keys(node.value)
                if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                        and t.value.id == name and isinstance(t.slice, ast.Constant)):
                    keys.add(str(t.slice.value))
    return keys


def _keys_returned(trees: Iterable[ast.AST], method: str) -> set[str]:
    keys: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == method:
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and ret.value is not None:
                        keys |= _literal_keys(ret.value)
                        if isinstance(ret.value, ast.Name):  # a local dict built, then returned
                            keys |= _keys_of_local(node, ret.value.id)
    return keys


def published_fields(root: Path) -> dict[str, set[str]]:
    """For each ``EventName.X`` published (``publish``, ``_publish``, ``Event.make``) in
    the code under ``root``, the fields it is published with: keyword arguments, and
    the keys of a ``**dict`` built in the same function or returned by the method called."""
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted(root.rglob("*.py"))]
    fields: dict[str, set[str]] = {}
    for tree in trees:
        funcs = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"publish", "_publish", "make"} and node.args):
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name)
                    and first.value.id == "EventName"):
                continue
            name = getattr(events.EventName, first.attr).value
            got = fields.setdefault(name, set())
            for kw in node.keywords:
                if kw.arg is not None:
                    got.add(kw.arg)
                elif isinstance(kw.value, ast.Name):
                    owner = next(f for f in funcs if node in ast.walk(f))
                    got |= _keys_of_local(owner, kw.value.id)
                elif isinstance(kw.value, ast.Call) and isinstance(kw.value.func, ast.Attribute):
                    got |= _keys_returned(trees, kw.value.func.attr)
                elif isinstance(kw.value, ast.Call) and isinstance(kw.value.func, ast.Name):
                    got |= _keys_returned(trees, kw.value.func.id)
    return fields


def event_problems(doc: str, names: type[enum.StrEnum], published: Mapping[str, set[str]]) -> list[str]:
    drawn = drawn_events(doc)
    declared = {str(e.value) for e in names}
    problems = [f"{n} is not in the drawing" for n in sorted(declared - set(drawn))]
    problems += [f"{n} is drawn but not an EventName" for n in sorted(set(drawn) - declared)]
    for name, fields in sorted(published.items()):
        if name in drawn and fields - drawn[name]:
            problems.append(f"{name} is published with {sorted(fields - drawn[name])}, not drawn")
    for name, fields in sorted(drawn.items()):
        if name in published and fields - published[name]:
            problems.append(f"{name} is drawn with {sorted(fields - published[name])}, never published")
    return problems


def test_the_event_list_is_drawn_as_it_is() -> None:
    assert events.__doc__ is not None
    published = published_fields(SRC / "corral")
    assert set(published) == {str(e.value) for e in events.EventName}  # every event is published
    assert event_problems(events.__doc__, events.EventName, published) == []


def test_an_undrawn_event_or_field_is_caught() -> None:
    assert events.__doc__ is not None
    published = published_fields(SRC / "corral")
    members = [(e.name, str(e.value)) for e in events.EventName] + [("MODEL_PINNED", "model_pinned")]
    more: type[enum.StrEnum] = enum.StrEnum("EventName", members)  # type: ignore[misc]
    assert event_problems(events.__doc__, more, published) == ["model_pinned is not in the drawing"]
    with_field = {**published, "model_removed": {"reason"}}
    assert event_problems(events.__doc__, events.EventName, with_field) == [
        "model_removed is published with ['reason'], not drawn"]


# ----------------------------------------------------------------- the wire conversation

_MESSAGE = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*\b")


def drawn_frames(doc: str) -> list[tuple[str, str]]:
    """(direction, message) for each message the conversation drawn in ``corral.wire``'s
    docstring names: ``"to"`` on a ``->`` line (router to worker), ``"from"`` on a ``<-``
    line; words in parentheses are comments, not messages."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == ["router", "worker"])
    drawn: list[tuple[str, str]] = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        bare = re.sub(r"\([^)]*\)", "", line)
        names = _MESSAGE.findall(bare)
        side = "to" if "->" in bare else "from" if "<-" in bare else None
        assert side is not None or not names, f"a message on a line with no arrow: {line!r}"
        drawn += [(str(side), n) for n in names]
    return drawn


def conversation_problems(doc: str, to_worker: Iterable[type], from_worker: Iterable[type]) -> list[str]:
    drawn = drawn_frames(doc)
    sides = {"to": {t.__name__ for t in to_worker} | {"WorkerSettings"},  # the spawn's argv
             "from": {t.__name__ for t in from_worker}}
    problems = []
    for side, names in sides.items():
        on_side = {n for s, n in drawn if s == side}
        problems += [f"{n} is not in the drawing" for n in sorted(names - {n for _, n in drawn})]
        problems += [f"{n} is drawn {side} the worker, but it is not a frame that way"
                     for n in sorted(on_side - names)]
    return problems


def test_the_wire_conversation_draws_every_frame() -> None:
    from typing import get_args

    from corral import wire

    assert wire.__doc__ is not None
    to_worker, from_worker = get_args(wire.ToWorker), get_args(wire.FromWorker)
    assert len(to_worker) >= 10 and len(from_worker) >= 11
    assert conversation_problems(wire.__doc__, to_worker, from_worker) == []


def test_an_undrawn_or_misdrawn_frame_is_caught() -> None:
    from typing import get_args

    import msgspec

    from corral import wire

    assert wire.__doc__ is not None
    to_worker, from_worker = get_args(wire.ToWorker), get_args(wire.FromWorker)

    class Pin(msgspec.Struct, tag="pin"):
        pass

    assert conversation_problems(wire.__doc__, [*to_worker, Pin], from_worker) == ["Pin is not in the drawing"]
    turned = wire.__doc__.replace("| <--------------------------------------- Paused   |",
                                  "| -- Paused ---------------------------------------> |")
    assert turned != wire.__doc__
    assert conversation_problems(turned, to_worker, from_worker) == [
        "Paused is drawn to the worker, but it is not a frame that way"]
    with pytest.raises(AssertionError, match="no arrow"):
        drawn_frames(re.sub(r"\| -- Shutdown -+> \|", "|    Shutdown    |", wire.__doc__))
