"""docs/architecture.md is a one-page map that stays true: every module, class, function and file:line it
names exists (tests/doc_refs.py), and so do the names in the subsystem notes under docs/design/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_refs import ROOT, build_index, problems

MAP = ROOT / "docs" / "architecture.md"
DESIGN = sorted((ROOT / "docs" / "design").glob("*.md"))


@pytest.fixture(scope="module")
def index():
    return build_index()


def test_the_map_is_one_page():
    assert MAP.stat().st_size <= 12_000, "docs/architecture.md is a one-page map: subsystem notes go to docs/design/"
    text = MAP.read_text(encoding="utf-8")
    for heading in ("## Layers", "## The life of a request", "## The runner interface", "## Where to add a feature"):
        assert heading in text


def test_every_name_the_map_gives_exists(index):
    assert problems(MAP, index) == []


@pytest.mark.parametrize("note", DESIGN, ids=[p.name for p in DESIGN])
def test_every_name_a_design_note_gives_exists(note, index):
    assert problems(note, index) == []


def test_the_life_of_a_request_has_ten_steps_with_lines(index):
    text = MAP.read_text(encoding="utf-8")
    life = text.split("## The life of a request", 1)[1].split("\n## ", 1)[0]
    steps = [line for line in life.splitlines() if re.match(r"\d+\. ", line)]
    assert len(steps) == 10
    assert all(".py:" in step for step in steps)


def test_the_checker_finds_what_is_wrong(tmp_path, index):
    doc = tmp_path / "wrong.md"
    doc.write_text(
        "`workbench/engine/no_such.py` and `Engine.no_such_method` and `PrefixCache.no_such`\n"
        "`NoSuchClass` and `no_such_function()` and `engine/engine.py:99999`\n"
        "`generation/scheduler.py:1` `Scheduler.generate`\n"
        "fine: `Engine.generate_tokens`, `wb.runs.table`, `engine.cancel()`, `torch.compile`, `runs.sqlite`\n",
        encoding="utf-8",
    )
    found = problems(doc, index)
    assert len(found) == 7, found
    for wrong in (
        "no_such.py",
        "Engine.no_such_method",
        "PrefixCache.no_such",
        "NoSuchClass",
        "no_such_function()",
        "engine/engine.py:99999",
        "Scheduler.generate",
    ):
        assert any(wrong in line for line in found), wrong
    assert not any(ok in " ".join(found) for ok in ("generate_tokens", "runs.table", "cancel", "torch", "sqlite"))


def test_the_design_notes_are_where_the_map_says():
    text = MAP.read_text(encoding="utf-8")
    for note in DESIGN:
        assert f"docs/design/{note.name}" in text, f"the map does not list {note.name}"
    assert Path(ROOT / "docs" / "design").is_dir()
