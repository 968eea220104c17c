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
        render("<!-- generated: no_such_table -->\n<!-- end generated: no_such_table -->")
    assert set(GENERATED) == {
        "methods_table",
        "families_table",
        "shipped_files_table",
        "common_options_table",
        "method_options_tables",
        "config_reference",
        "layer_reference",
    }


def test_the_api_reference_lists_every_config_and_layer_of_every_method():
    from hf_tensorcompress.core.registry import config_class, get_method, records
    from mkdocs_hooks import render

    configs = render((DOCS / "api" / "configs.md").read_text(encoding="utf-8"))
    layers = render((DOCS / "api" / "layers.md").read_text(encoding="utf-8"))
    for name in records():
        cls = config_class(name)
        assert f"::: {cls.__module__}.{cls.__qualname__}\n" in configs
        for layer in get_method(name).layers:
            assert f"::: {layer.__module__}.{layer.__qualname__}\n" in layers


def test_the_repository_holds_the_generated_tables_as_the_code_makes_them():
    """A reader of the .md files in the repository sees the tables, not an empty marker: every generated block holds
    what the code makes now (``python mkdocs_hooks.py`` rewrites them)."""
    from mkdocs_hooks import BLOCK, refreshed

    blocks = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks += len(BLOCK.findall(text))
        assert refreshed(text) == text, f"{page}: generated tables out of date; run `python mkdocs_hooks.py`"
    assert blocks >= 5
    for match in BLOCK.finditer((DOCS / "guide" / "options.md").read_text(encoding="utf-8")):
        assert "\n| " in match.group(0), f"empty generated block {match.group(1)}"


def test_a_generated_marker_without_its_partner_is_an_error():
    from mkdocs_hooks import render

    with pytest.raises(ValueError, match="no partner"):
        render("<!-- generated: methods_table -->\n| a table pasted by hand |\n")
    with pytest.raises(ValueError, match="no partner"):
        render("text\n<!-- end generated: methods_table -->\n")


def section_rows(page: str, heading: str) -> list[str]:
    """The table rows of ``page``'s section under the heading line ``heading``, up to the next heading."""
    lines = page[page.index(f"\n{heading}\n") + len(heading) + 2 :].splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("#")), len(lines))
    return [line for line in lines[:end] if line.startswith("| `")]


def test_the_options_page_lists_every_field_of_every_method_config():
    from dataclasses import fields

    from hf_tensorcompress.config import CompressionConfig, config_classes
    from mkdocs_hooks import render

    page = render((DOCS / "guide" / "options.md").read_text(encoding="utf-8"))
    common = {row.split("`")[1] for row in section_rows(page, "## Every method")}
    assert common == {item.name for item in fields(CompressionConfig)}
    assert set(config_classes()) >= {"cp", "svd", "biprop", "tt", "tiered"}
    for method, cls in config_classes().items():
        rows = {row.split("`")[1]: row for row in section_rows(page, f'### `{cls.__name__}`: `method="{method}"`')}
        assert {item.name for item in fields(cls)} <= set(rows) | common, cls.__name__
        for item in fields(cls):
            if item.name in rows:
                assert all(cell.strip() for cell in rows[item.name].split(" | ")), rows[item.name]
            for choice in item.metadata.get("choices", ()):
                assert f"`{choice!r}`".replace("'", '"') in rows[item.name], (cls.__name__, item.name, choice)
    assert '`"all-linear"`' in section_rows(page, '### `BipropConfig`: `method="biprop"`')[0]  # redescribed


def test_an_options_table_takes_defaults_choices_and_text_from_the_config_class():
    from dataclasses import dataclass, field

    from hf_tensorcompress.config import CompressionConfig, one_of
    from mkdocs_hooks import options_table, own_fields

    @dataclass
    class ToyConfig(CompressionConfig):
        """A toy method.

        Args:
            target_modules: only ``"toy"`` here.
            mode: how the toy works, ``"fast"`` or ``"slow"``.
            sizes: one size per | part.
        """

        mode: str = one_of("fast", ("fast", "slow"))
        sizes: list[int] = field(default_factory=lambda: [1, 2])

    assert own_fields(ToyConfig) == ["target_modules", "mode", "sizes"]
    table = options_table(ToyConfig, own_fields(ToyConfig)).splitlines()
    assert table[3] == '| `mode` | `"fast"` | one of `"fast"`, `"slow"` | how the toy works, `"fast"` or `"slow"`. |'
    assert table[4] == "| `sizes` | `[1, 2]` | list[int] | one size per \\| part. |"

    @dataclass
    class Undocumented(ToyConfig):
        """Args:
        mode: documented.
        """

        extra: int = 0

    with pytest.raises(ValueError, match=r"Undocumented: field\(s\) \['extra'\] have no entry in the Args"):
        options_table(Undocumented, own_fields(Undocumented))


def pyproject_extras() -> dict[str, list[str]]:
    """``[project.optional-dependencies]`` of pyproject.toml: extra -> the requirements it lists (read as text)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text[text.index("[project.optional-dependencies]\n") :].split("\n[", 1)[0]
    return {
        name: re.findall(r'"([^"]+)"', value) for name, value in re.findall(r"^([\w-]+) = (\[.*\])$", section, re.M)
    }


def test_the_install_page_names_every_extra_and_what_it_installs():
    text = (DOCS / "install.md").read_text(encoding="utf-8")
    table = text[text.index("| extra | installs | needed for |") :].split("\n\n")[0].splitlines()[2:]
    rows = {cells[0].strip("` "): cells[1] for cells in (line.strip("|").split("|") for line in table)}
    extras = pyproject_extras()
    assert {"lm", "quant", "onnx", "all", "dev"} <= set(extras)
    assert set(rows) == set(extras), "the install page's extras table and pyproject.toml name different extras"
    for extra, requirements in extras.items():
        for requirement in requirements:
            package, included = re.match(r"([\w.-]+)(?:\[([\w,]+)\])?", requirement).groups(default="")
            names = [f"`{name}`" for name in included.split(",")] if package == "hf_tensorcompress" else [package]
            for name in names:
                assert name in rows[extra], f"extra {extra!r}: the install page does not say it installs {name}"


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
