"""The docs site (mkdocs.yml, docs/): every ```python block of every page runs, every page is in the navigation,
and no page points outside the repository. How blocks run and their flags: ``tests/doc_blocks.py``. The site itself
builds with ``make docs`` (``mkdocs build --strict``), which ``.ci/run`` runs."""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT, params, run

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
PARAMS = params(PAGES)


@pytest.mark.parametrize("group", PARAMS)
def test_docs_python_block_runs(group, tmp_path, monkeypatch, request):
    run(group, tmp_path, monkeypatch, request)


def nav_pages() -> set[str]:
    """The pages named in mkdocs.yml's nav (read as text: the file needs no YAML library)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return set(re.findall(r"([\w/.-]+\.md)\s*$", nav, re.M))


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    from mkdocs_hooks import method_pages

    pages = {str(page.relative_to(DOCS)) for page in PAGES}
    nav = nav_pages()
    nav |= {path for entry in method_pages(DOCS, nav) for path in entry.values()}  # the hook adds method pages
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"
    assert pages - nav == set(), f"pages missing from the nav in mkdocs.yml: {sorted(pages - nav)}"


def test_the_site_builds_its_tables_from_the_code():
    from hf_tensorcompress.core.export import shipped_files_table
    from hf_tensorcompress.core.registry import methods_table
    from mkdocs_hooks import GENERATED, render

    options = render((DOCS / "guide" / "options.md").read_text(encoding="utf-8"))
    assert methods_table() in options and "<!-- generated" not in options
    assert shipped_files_table() in render((DOCS / "architecture.md").read_text(encoding="utf-8"))
    assert "| method `tt` |" in shipped_files_table() and "`tt_layer.py`" in shipped_files_table()
    with pytest.raises(KeyError):
        render("<!-- generated: no_such_table -->")
    assert set(GENERATED) == {"methods_table", "families_table", "shipped_files_table"}


def test_a_method_page_missing_from_the_nav_is_added_under_its_heading(tmp_path):
    from mkdocs_hooks import method_pages

    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "cp.md").write_text("# CP\n")
    (tmp_path / "methods" / "toy.md").write_text("intro\n# Toy method\n")
    assert method_pages(tmp_path, {"methods/cp.md"}) == [{"Toy method": "methods/toy.md"}]


def test_every_method_has_a_page_with_a_runnable_example():
    from hf_tensorcompress.core.registry import records

    for method in records():
        page = DOCS / "methods" / f"{method}.md"
        text = page.read_text(encoding="utf-8")
        assert f'method="{method}"' in text and "```python" in text, page


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_pages_stay_inside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    assert "DESIGN" + ".md" not in text and "shared/" not in text, page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        assert "://" not in target, f"{page}: link outside the repository: {target}"
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(DOCS), f"{page}: link outside the docs: {target}"
        assert resolved.exists(), f"{page}: link to a missing file: {target}"
