"""The python blocks of docs/guide/errors.md run, in order, in one namespace (each builds on the one before), in a
temporary working directory."""

from __future__ import annotations

from pathlib import Path

from test_readme import python_blocks

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "errors.md"


def test_the_error_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    namespace: dict = {"__name__": "__guide__"}
    for block in blocks:
        exec(compile(block.code, f"{GUIDE.name}:{block.line}", "exec"), namespace)  # noqa: S102 - the guide's examples
