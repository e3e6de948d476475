"""The user guide (docs/guide/) and the README say what the server is: the configuration page
has a row for every key the config's classes accept, some guide page names every route of the
OpenAPI document, the README stays a front door (at most 15 KiB, install, a first chat, a
second model and the page on its first screen, each section linking into the guide), and no
user page names a test file. (The guide's links are checked with the other docs' in
tests/test_docs.py.) Each checker is also run on a made-up mismatch."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
from pydantic import BaseModel

from corral.api.app import create_app
from corral.config.file import CorralConfig, ModelConfig, ServerConfig
from corral.model.settings import LoraAdapter, ModelSettings, Turn

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
CONFIGURATION = GUIDE / "configuration.md"
README_MAX_BYTES = 15 * 1024
FIRST_SCREEN_LINES = 60

# Routes of the OpenAPI document that no guide page needs to name, each with its reason.
# (Empty today: the guide names every route.)
ROUTES_LEFT_OUT: dict[str, str] = {}

# The heading of the configuration page's section that lists each settings class's keys.
# ModelSettings' keys go in [defaults] and in every [models."ID"] table (the loader takes them
# out of both: corral.config.file._split_settings), so they have one section for the two.
SECTIONS: dict[type, str] = {
    CorralConfig: "## The tables",
    ServerConfig: "## `[server]`",
    ModelConfig: '## `[models."ID"]`',
    ModelSettings: "## Model settings",
    LoraAdapter: "### A LoRA adapter",
    Turn: "### An opening message",
}


def guide_pages() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


# ----------------------------------------------------------------- every config key

def _classes_in(annotation: object) -> Iterator[type]:
    """The settings classes (pydantic models, msgspec structs) an annotation holds at any
    depth: ``list[LoraAdapter] | None`` holds LoraAdapter."""
    if isinstance(annotation, type) and issubclass(annotation, (BaseModel, msgspec.Struct)):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _classes_in(arg)


def config_keys(root: type) -> dict[type, list[str]]:
    """Every class a config file can reach from ``root``, with the keys it takes as TOML
    writes them (a field's alias or encode name), walking nested tables and lists of tables.
    A pydantic field with ``exclude=True`` is not read from the file; ``CorralConfig``'s
    ``[defaults]`` and each model table take ``ModelSettings``' keys besides their own."""
    found: dict[type, list[str]] = {}
    todo = [root, *([ModelSettings] if root is CorralConfig else [])]
    while todo:
        cls = todo.pop(0)
        if cls in found:
            continue
        keys: list[str] = []
        annotations: list[object] = []
        if issubclass(cls, BaseModel):
            for name, field in cls.model_fields.items():
                if field.exclude:
                    continue
                keys.append(field.alias or name)
                annotations.append(field.annotation)
        else:
            hints = typing.get_type_hints(cls, include_extras=True)
            for f in msgspec.structs.fields(cls):
                keys.append(f.encode_name)
                annotations.append(hints[f.name])
        found[cls] = keys
        todo += [c for a in annotations for c in _classes_in(a)]
    return found


def section(text: str, heading: str) -> str | None:
    """The text under a heading (``## ...``), up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == heading or line.startswith(heading + " "):
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"#{{1,{level}}} ", lines[j])), len(lines))
            return "\n".join(lines[i + 1:end])
    return None


def undocumented_keys(text: str, classes: dict[type, list[str]],
                      sections: dict[type, str]) -> list[str]:
    """Each key whose class's section of the page has no table row starting with it (`` | `key` | ``),
    and each class the page has no section for."""
    problems = []
    for cls, keys in classes.items():
        heading = sections.get(cls)
        body = section(text, heading) if heading is not None else None
        if body is None:
            problems.append(f"{cls.__module__}.{cls.__qualname__}: no section for its keys "
                            f"(add one to docs/guide/configuration.md and to SECTIONS)")
            continue
        rows = set(re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE))
        problems += [f"{heading.lstrip('# ')}: no row for key `{key}` "
                     f"({cls.__module__}.{cls.__qualname__}.{key})"
                     for key in keys if key not in rows]
    return problems


def test_configuration_page_names_every_key() -> None:
    classes = config_keys(CorralConfig)
    assert {ServerConfig, ModelConfig, ModelSettings, LoraAdapter} <= set(classes)
    assert "max_queue" in classes[ServerConfig] and "scale" in classes[LoraAdapter]
    text = CONFIGURATION.read_text(encoding="utf-8")
    assert undocumented_keys(text, classes, SECTIONS) == []


def test_the_key_check_can_fail() -> None:
    classes = config_keys(CorralConfig)
    text = CONFIGURATION.read_text(encoding="utf-8")
    without = text.replace("| `max_queue` |", "| max_queue |")
    assert without != text
    assert undocumented_keys(without, classes, SECTIONS) == [
        "`[server]`: no row for key `max_queue` (corral.config.file.ServerConfig.max_queue)"]

    class Extra(BaseModel):
        new_key: int = 0

    class Added(ServerConfig):  # a key and a table added without docs
        added_key: int = 0
        extra: list[Extra] = []

    here = Added.__module__
    assert undocumented_keys(text, config_keys(Added), {**SECTIONS, Added: "## `[server]`"}) == [
        f"`[server]`: no row for key `added_key` ({here}.{Added.__qualname__}.added_key)",
        f"`[server]`: no row for key `extra` ({here}.{Added.__qualname__}.extra)",
        f"{here}.{Extra.__qualname__}: no section for its keys (add one to "
        "docs/guide/configuration.md and to SECTIONS)",
    ]

    class MoreSettings(ModelSettings, kw_only=True):  # a model setting added without docs
        new_setting: int = 0

    assert undocumented_keys(text, config_keys(MoreSettings), {**SECTIONS, MoreSettings: "## Model settings"}) == [
        f"Model settings: no row for key `new_setting` ({here}.{MoreSettings.__qualname__}.new_setting)"]


# ----------------------------------------------------------------- every route

def openapi_paths() -> list[str]:
    """The paths of the OpenAPI document the router serves (built without a model)."""
    app = create_app(CorralConfig(server=ServerConfig(include_default_model=False)),
                     embedded=False, use_store=False)
    return sorted(app.openapi()["paths"])


def _params_as_braces(text: str) -> str:
    return re.sub(r"\{[^{}/\s`]*\}", "{}", text)


def unnamed_routes(paths: Iterable[str], texts: Iterable[str], left_out: dict[str, str]) -> list[str]:
    """The paths no text names, as written (a path parameter may have any name: ``{id}``
    names ``{model_id}``), other than those left out; and left-out paths that are not routes."""
    joined = _params_as_braces("\n".join(texts))
    paths = list(paths)
    missing = [p for p in paths if p not in left_out and not re.search(
        rf"(?<![\w/{{}}.-]){re.escape(_params_as_braces(p))}(?![\w/{{}}-])", joined)]
    return ([f"{p}: named by no docs/guide page (document it, or add it to ROUTES_LEFT_OUT "
             "with a reason)" for p in missing]
            + [f"{p}: in ROUTES_LEFT_OUT but not a route" for p in left_out if p not in paths])


def test_guide_names_every_route() -> None:
    paths = openapi_paths()
    assert {"/v1/chat/completions", "/api/chat", "/v1/messages", "/models/{model_id}"} <= set(paths)
    texts = [p.read_text(encoding="utf-8") for p in guide_pages()]
    assert unnamed_routes(paths, texts, ROUTES_LEFT_OUT) == []


def test_the_route_check_can_fail() -> None:
    paths = ["/models", "/models/load", "/v1/responses/{response_id}", "/slots/{id_slot}", "/new"]
    texts = ["`POST /models/load` and `GET /models/events`", "`GET /v1/responses/{id}/cancel`",
             "`POST /slots/{id}?action=save`"]
    assert unnamed_routes(paths, texts, {"/gone": "removed"}) == [
        "/models: named by no docs/guide page (document it, or add it to ROUTES_LEFT_OUT with a reason)",
        "/v1/responses/{response_id}: named by no docs/guide page (document it, or add it to "
        "ROUTES_LEFT_OUT with a reason)",
        "/new: named by no docs/guide page (document it, or add it to ROUTES_LEFT_OUT with a reason)",
        "/gone: in ROUTES_LEFT_OUT but not a route",
    ]
    assert unnamed_routes(paths, [*texts, "`GET /models`, `/v1/responses/{id}`, /new"], {}) == []


# ----------------------------------------------------------------- the front door

def readme_problems(text: str) -> list[str]:
    """What keeps a README from being the front door: its size, a first screen without
    install, a first chat, a second model and the page, a section without a link into the guide."""
    problems = []
    if (size := len(text.encode("utf-8"))) > README_MAX_BYTES:
        problems.append(f"README.md is {size} bytes, over {README_MAX_BYTES}: move text to docs/guide/")
    if "](docs/guide/index.md)" not in text:
        problems.append("README.md does not link docs/guide/index.md")
    first = "\n".join(text.splitlines()[:FIRST_SCREEN_LINES])
    for what, needle in [("install (make serve)", r"make serve"),
                         ("a first chat (/v1/chat/completions)", r"/v1/chat/completions"),
                         ("a second model (corral pull SOURCE)", r"corral pull [\w.-]+/"),
                         ("the page (its address)", r"http://127\.0\.0\.1:8080/\*\*")]:
        if not re.search(needle, first):
            problems.append(f"README.md's first {FIRST_SCREEN_LINES} lines lack {what}")
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        if "](docs/guide/" not in part:
            problems.append(f"README.md section {part.splitlines()[0]!r} links no docs/guide/ page")
    return problems


def test_readme_is_a_front_door() -> None:
    assert readme_problems(README.read_text(encoding="utf-8")) == []


def test_the_front_door_check_can_fail() -> None:
    text = README.read_text(encoding="utf-8")
    long = text.replace("](docs/guide/index.md)", "](docs/guide/)") + "x" * README_MAX_BYTES
    got = readme_problems(long + "\n## More\n\nno link\n")
    assert len(got) == 3 and got[0].startswith("README.md is ") and got[1:] == [
        "README.md does not link docs/guide/index.md",
        "README.md section 'More' links no docs/guide/ page"]
    moved = "\n" * FIRST_SCREEN_LINES + text
    assert readme_problems(moved) == [
        f"README.md's first 60 lines lack {what}" for what in (
            "install (make serve)", "a first chat (/v1/chat/completions)",
            "a second model (corral pull SOURCE)", "the page (its address)")]


# ----------------------------------------------------------------- no test files

_TEST_FILE = re.compile(r"(?<![\w./-])tests/|(?<![\w-])test_\w+\.py")


def named_test_files(text: str) -> list[str]:
    return [m.group(0) for m in _TEST_FILE.finditer(text)]




def test_user_pages_name_no_test_file() -> None:
    pages = [README, *guide_pages()]
    assert len(pages) >= 10
    assert {str(p.relative_to(ROOT)): named_test_files(p.read_text(encoding="utf-8")) for p in pages} == {
        str(p.relative_to(ROOT)): [] for p in pages}


def test_the_test_file_check_can_fail() -> None:
    assert named_test_files("replayed by `tests/api/test_codex_session.py`, see test_docs.py; "
                           "the tests of corral, contests/x") == [
        "tests/", "test_codex_session.py", "test_docs.py"]
