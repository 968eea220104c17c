"""mkdocs hooks (``hooks:`` in mkdocs.yml): what the docs derive from the code instead of keeping by hand.

- A page's ``<!-- generated: NAME -->`` line becomes the table the library's function ``NAME`` makes (the registry's
  methods, the family table, the files checkpoints ship), so a new method or family needs no table pasted.
- Every page in ``docs/methods/`` that the nav of mkdocs.yml does not list is added to its "Methods" section, titled
  by the page's first heading: a new method's page is its whole documentation change.
"""

from __future__ import annotations

import re
from pathlib import Path

#: ``<!-- generated: NAME -->`` -> the function making that table.
GENERATED = {
    "methods_table": "hf_tensorcompress.core.registry:methods_table",
    "families_table": "hf_tensorcompress.core.targets:families_table",
    "shipped_files_table": "hf_tensorcompress.core.export:shipped_files_table",
}
MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.MULTILINE)


def generated(name: str) -> str:
    """The table ``name`` names (an unknown name is an error, so a typo fails the strict build)."""
    import importlib

    module, _, function = GENERATED[name].partition(":")
    return getattr(importlib.import_module(module), function)()


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by its table."""
    return MARKER.sub(lambda match: generated(match.group(1)), markdown)


def method_pages(docs: Path, listed: set[str]) -> list[dict[str, str]]:
    """Nav entries for the ``methods/`` pages ``listed`` lacks: ``{title: path}``."""
    entries = []
    for page in sorted((docs / "methods").glob("*.md")):
        path = f"methods/{page.name}"
        if path not in listed:
            heading = next(
                (line[2:].strip() for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("# ")),
                page.stem,
            )
            entries.append({heading: path})
    return entries


def listed_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(listed_pages(value) for value in nav.values()))
    return set().union(*(listed_pages(item) for item in nav)) if nav else set()


def on_config(config):
    section = next(item["Methods"] for item in config["nav"] if isinstance(item, dict) and "Methods" in item)
    section += method_pages(Path(config["docs_dir"]), listed_pages(config["nav"]))
    return config


def on_page_markdown(markdown, page, config, files):
    return render(markdown)
