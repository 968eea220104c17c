"""Every ```python block of README.md runs, so the README cannot rot (how blocks run: ``tests/doc_blocks.py``)."""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT, params, python_blocks, run

README = ROOT / "README.md"
PARAMS = params([README])


@pytest.mark.parametrize("group", PARAMS)
def test_readme_python_block_runs(group, tmp_path, monkeypatch, request):
    run(group, tmp_path, monkeypatch, request)


def test_readme_is_short_and_documents_every_method():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "the README is for users: keep it under 300 lines, details go to docs/"
    for method in ("cp", "svd", "biprop", "tt", "tiered"):
        assert f'method="{method}"' in text, method
    assert "SmartformerTrainer" in text
    assert "DESIGN" + ".md" not in text and "../" not in text  # no references to documents outside the repository
    for section in ("Install", "Methods", "Smartformer", "Documentation"):
        assert re.search(rf"^## .*{section}", text, re.M), section
    # one runnable example per method and one for the search
    assert len(python_blocks(README)) >= 5


def test_readme_links_point_to_files_in_the_repository():
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        assert "://" not in target, f"README links outside the repository: {target}"
        assert (ROOT / target).exists(), f"README links to a missing file: {target}"
