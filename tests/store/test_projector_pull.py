"""A Hub repo's vision projector is pulled together with its model (``owner/repo:TAG``):
the same child, resume, checksum and progress; ``<id>.mmproj.gguf`` next to the model, named
by the manifest; the catalog gives the model that projector. And which projector
(``pick_projector``) and which file beside a model (``find_projector``) is a model's."""

from __future__ import annotations

import hashlib
from pathlib import Path

from corral.config.file import config_from_dict
from corral.control.catalog import specs_from_config
from corral.events import EventBus
from corral.store.local import ModelStore
from corral.store.projector import find_projector, projector_for
from corral.store.sources import pick_projector

from .conftest import small_gguf
from .fake_hub import FakeHub
from .test_downloads import manager, terminal_for, until

REPO = "me/vis-GGUF"


def vision_repo(hub: FakeHub) -> tuple[bytes, bytes]:
    model, proj = small_gguf(300_000, seed=11), small_gguf(120_000, seed=12)
    hub.add(f"{REPO}/vis-Q8_0.gguf", model)
    hub.add(f"{REPO}/vis-Q4_K_M.gguf", small_gguf(50_000, seed=13))
    hub.add(f"{REPO}/mmproj-vis-F16.gguf", small_gguf(40_000, seed=14))
    hub.add(f"{REPO}/mmproj-vis-Q8_0.gguf", proj)  # the model's quantization wins
    hub.add(f"{REPO}/other/mmproj-else.gguf", small_gguf(10_000, seed=15))  # another folder: never
    return model, proj


async def test_tag_pull_brings_the_projector(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    model, proj = vision_repo(hub)
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}:Q8_0")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_finished", events[-1]
    assert events[0]["total"] == len(model) + len(proj)  # one pull, one progress over both files
    progress = [e["done"] for e in events if e["event"] == "download_progress"]
    assert progress == sorted(progress)
    (m,) = store.list()  # the projector is no model of its own
    assert m.id == f"{REPO}:Q8_0" and m.path.read_bytes() == model
    assert m.mmproj == store.projector_file_path(m.id) and m.mmproj.read_bytes() == proj
    assert m.to_dict()["mmproj"] == str(m.mmproj)
    assert not any(store.partial_dir.iterdir())
    # the catalog gives the model its projector (the manifest says which)
    cfg = config_from_dict({"server": {"include_default_model": False}})
    (spec,) = specs_from_config(cfg, store.list())
    assert spec.mmproj == str(m.mmproj) and spec.projector_bytes() == len(proj)
    # removing the model removes the projector pulled with it
    store.remove(m.id)
    assert not m.mmproj.exists() and not m.path.exists()


async def test_projector_cut_resumes_and_bad_projector_leaves_nothing(hub: FakeHub, store: ModelStore,
                                                                      bus: EventBus) -> None:
    model, proj = vision_repo(hub)
    f = hub.files[f"{REPO}/mmproj-vis-Q8_0.gguf"]
    f.behavior.cut_after = 50_000
    h = await manager(store, bus).start(f"{REPO}:Q8_0", model_id="vis")
    assert await h.wait() == "finished", h.reason
    assert hub.range_starts(f"{REPO}/mmproj-vis-Q8_0.gguf") == [None, 50_000]
    assert store.get("vis").mmproj.read_bytes() == proj  # type: ignore[union-attr]
    # wrong projector bytes: the pull fails and neither file is placed (no model without its projector)
    f.behavior.cut_after = None
    f.behavior.wrong_bytes = True
    async with bus.subscribe() as q:
        h = await manager(store, bus).start(f"{REPO}:Q8_0", model_id="vis2")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_failed" and "checksum mismatch" in events[-1]["reason"]
    assert "mmproj-vis-Q8_0.gguf" in events[-1]["reason"]
    assert [x.id for x in store.list()] == ["vis"]
    assert not store.model_file_path("vis2").exists() and not store.projector_file_path("vis2").exists()


async def test_file_pull_has_no_projector(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    model, _ = vision_repo(hub)
    h = await manager(store, bus).start(f"{REPO}/vis-Q8_0.gguf")
    assert await h.wait() == "finished", h.reason
    (m,) = store.list()
    assert m.mmproj is None and m.path.read_bytes() == model
    assert not any(p.name.endswith(".mmproj.gguf") for p in store.root.iterdir())


def test_pick_projector() -> None:
    files = ["a-Q4_K_M.gguf", "a-Q8_0.gguf", "mmproj-a-f16.gguf", "mmproj-a-bf16.gguf", "sub/mmproj-x.gguf",
             "README.md"]
    assert pick_projector(files, "a-Q4_K_M.gguf") == "mmproj-a-f16.gguf"
    assert pick_projector([*files, "mmproj-a-Q8_0.gguf"], "a-Q8_0.gguf") == "mmproj-a-Q8_0.gguf"
    assert pick_projector(["a.gguf", "mmproj-model.gguf"], "a.gguf") == "mmproj-model.gguf"
    assert pick_projector(["a.gguf", "sub/b.gguf", "sub/mmproj.gguf"], "a.gguf") is None
    assert pick_projector(["a.gguf", "sub/b.gguf", "sub/mmproj.gguf"], "sub/b.gguf") == "sub/mmproj.gguf"
    assert pick_projector(["a.gguf"], "a.gguf") is None


def test_find_projector_next_to_the_model(tmp_path: Path) -> None:
    def touch(*names: str) -> Path:
        d = tmp_path / hashlib.sha1("".join(names).encode()).hexdigest()[:8]
        d.mkdir()
        for n in names:
            (d / n).write_bytes(b"GGUF")
        return d

    d = touch("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f16.gguf")  # a model's own folder
    assert find_projector(d / "gemma-3-4b-it-Q4_K_M.gguf") == d / "mmproj-model-f16.gguf"
    d = touch("foo.gguf", "foo-bar.gguf", "mmproj-foo-bar.gguf", "foo.mmproj.gguf")  # a shared folder
    assert find_projector(d / "foo-bar.gguf") == d / "mmproj-foo-bar.gguf"  # the longest stem owns it
    assert find_projector(d / "foo.gguf") == d / "foo.mmproj.gguf"
    d = touch("a.gguf", "b.gguf", "mmproj-c.gguf")  # nobody's
    assert find_projector(d / "a.gguf") is None and find_projector(d / "b.gguf") is None
    d = touch("a.gguf")
    assert find_projector(d / "a.gguf") is None
    # the setting wins: a path, or "" for none at all; then a pulled one; then the search
    d = touch("m.gguf", "mmproj-m.gguf")
    assert projector_for(d / "m.gguf", None) == d / "mmproj-m.gguf"
    assert projector_for(d / "m.gguf", "") is None
    assert projector_for(d / "m.gguf", "/x/p.gguf") == Path("/x/p.gguf")
    assert projector_for(d / "m.gguf", None, Path("/y/q.gguf")) == Path("/y/q.gguf")


def test_mmproj_setting_resolves_like_the_model_path(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-m.gguf").write_bytes(b"GGUF" + bytes(96))
    cfg = config_from_dict({"server": {"include_default_model": False},
                            "models": {"a": {"path": "m.gguf", "mmproj": "proj/p.gguf"},
                                       "b": {"path": "m.gguf"}, "c": {"path": "m.gguf", "mmproj": ""}}},
                           base_dir=tmp_path)
    specs = {s.id: s for s in specs_from_config(cfg)}
    assert specs["a"].mmproj == str(tmp_path / "proj" / "p.gguf") and specs["a"].projector_bytes() == 0
    assert specs["b"].mmproj == str(tmp_path / "mmproj-m.gguf") and specs["b"].projector_bytes() == 100
    assert specs["c"].mmproj is None
    # the worker gets the resolved path; a changed projector restarts it
    assert specs["b"].worker_settings(0, 1).mmproj == str(tmp_path / "mmproj-m.gguf")
    assert specs["a"].worker_key() != specs["b"].worker_key()


async def test_an_audio_projector_is_pulled_and_hears(hub: FakeHub, store: ModelStore, bus: EventBus,
                                                       tmp_path: Path) -> None:
    """An audio repo (Ultravox, Qwen2-Audio: ``mmproj-*.gguf`` as for vision) pulls its
    projector the same way, and the header says the model hears (control/capabilities.py)."""
    from corral.control.capabilities import projector_encoders
    from testkit.gguf_audio import write_qwen2a_mmproj

    repo = "me/hear-GGUF"
    proj = write_qwen2a_mmproj(tmp_path / "p.gguf", n_layer=1).read_bytes()
    hub.add(f"{repo}/hear-Q8_0.gguf", small_gguf(200_000, seed=21))
    hub.add(f"{repo}/mmproj-hear-f16.gguf", proj)
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start(f"{repo}:Q8_0")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_finished", events[-1]
    (m,) = store.list()
    assert m.mmproj is not None and m.mmproj.read_bytes() == proj
    assert projector_encoders(m.mmproj) == (False, True)  # hears, does not see
