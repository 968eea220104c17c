"""mkdocs hooks (``hooks:`` in mkdocs.yml): what the docs derive from the code instead of keeping by hand.

- A page's ``<!-- generated: NAME -->`` … ``<!-- end generated: NAME -->`` block holds the table that ``NAME`` makes
  from the code (the registry's methods, every method's options, the family table, the files checkpoints ship).
  The build always shows the table made now; the copy committed between the markers is there for readers of the
  repository, and ``python mkdocs_hooks.py`` rewrites it (``tests/test_docs.py`` fails while it is out of date).
  A new method, option or family needs no table edited by hand.
- Every page in ``docs/methods/`` that the nav of mkdocs.yml does not list is added to its "Methods" section, titled
  by the page's first heading: a new method's page is its whole documentation change.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from dataclasses import MISSING, Field, fields
from pathlib import Path

DOCS = Path(__file__).parent / "docs"
BLOCK = re.compile(r"^<!-- generated: (\w+) -->\n.*?^<!-- end generated: \1 -->$", re.MULTILINE | re.DOTALL)


# ------------------------------------------------------------------------------------------- the options tables
def option_descriptions(cls: type) -> dict[str, str]:
    """``{field: text}`` from the ``Args:`` sections of the docstrings of ``cls`` and its bases (the nearest wins),
    read by griffe, the docstring parser of the API reference; one line each, ready for a table cell."""
    from griffe import Docstring, DocstringSectionKind

    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        for section in Docstring(text, parser="google").parse(warn_missing_types=False):
            if section.kind is DocstringSectionKind.parameters:
                found.update({item.name: markdown_line(item.description) for item in section.value})
    return found


def markdown_line(docstring_text: str) -> str:
    """Docstring text as one line of Markdown that fits a table cell: double-backtick code as single-backtick code, pipes escaped."""
    return re.sub(r"``(.+?)``", r"`\1`", " ".join(docstring_text.split())).replace("|", "\\|")


def shown(value: object) -> str:
    """A default or choice as written in Python code (strings in double quotes)."""
    return f"`{json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)}`"


def default_of(item: Field) -> str:
    if item.default_factory is not MISSING:
        return shown(item.default_factory())
    return shown(item.default)


def values_of(item: Field) -> str:
    """The field's choices (``config.one_of``: the tuple its validation checks), else its annotation."""
    kind = str(item.type).replace(" | ", " or ")
    choices = item.metadata.get("choices")
    if not choices:
        return kind
    listed = "one of " + ", ".join(shown(choice) for choice in choices)
    if "list[" in kind:
        listed = f"a list, each entry {listed}"
    return listed + ("; or `None`" if "None" in kind and None not in choices else "")


def options_table(cls: type, names: list[str]) -> str:
    """The table of ``cls``'s fields ``names``: default, allowed values, meaning. A field its docstring does not
    describe is an error, so a new option cannot reach the docs without its text."""
    described = option_descriptions(cls)
    missing = [name for name in names if name not in described]
    if missing:
        raise ValueError(
            f"{cls.__name__}: field(s) {missing} have no entry in the Args: section of its docstring; the options "
            "page is built from it"
        )
    by_name = {item.name: item for item in fields(cls)}
    rows = ["| option | default | values | what it does |", "|---|---|---|---|"]
    for name in names:
        item = by_name[name]
        rows.append(f"| `{name}` | {default_of(item)} | {values_of(item)} | {described[name]} |")
    return "\n".join(rows)


def common_options_table() -> str:
    """The fields every method's config takes (``CompressionConfig``'s)."""
    from hf_tensorcompress.config import CompressionConfig

    return options_table(CompressionConfig, [item.name for item in fields(CompressionConfig)])


def own_fields(cls: type) -> list[str]:
    """The fields of method config ``cls`` beyond those every config takes, plus those its own docstrings describe
    again (e.g. biprop's ``target_modules``, which takes ``"all-linear"`` there)."""
    from hf_tensorcompress.config import CompressionConfig

    common = {item.name for item in fields(CompressionConfig)}
    base, own = option_descriptions(CompressionConfig), option_descriptions(cls)
    return [item.name for item in fields(cls) if item.name not in common or own.get(item.name) != base.get(item.name)]


def method_options_tables() -> str:
    """One section per registered method: its config class, what it does, the table of its own options."""
    from hf_tensorcompress.config import config_classes

    sections = []
    for method, cls in config_classes().items():
        summary = markdown_line(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0])
        sections.append(
            f'### `{cls.__name__}`: `method="{method}"`\n\n{summary} The method: [{method}](../methods/{method}.md).'
            f"\n\n{options_table(cls, own_fields(cls))}"
        )
    return "\n\n".join(sections)


def config_reference() -> str:
    """The API reference of every registered method's config class (mkdocstrings' ``:::`` lines)."""
    from hf_tensorcompress.config import config_classes

    return "\n\n".join(f"::: {cls.__module__}.{cls.__qualname__}" for cls in config_classes().values())


def layer_reference() -> str:
    """The API reference of every layer class a registered method installs (mkdocstrings' ``:::`` lines)."""
    from hf_tensorcompress.core.registry import get_method, records

    layers = [layer for name in records() for layer in get_method(name).layers]
    return "\n\n".join(f"::: {layer.__module__}.{layer.__qualname__}" for layer in layers)


# ------------------------------------------------------------------------------------------- generated blocks
#: ``<!-- generated: NAME -->`` -> the function making that table: ``"module:function"`` or a function here.
GENERATED = {
    "methods_table": "hf_tensorcompress.core.registry:methods_table",
    "families_table": "hf_tensorcompress.core.targets:families_table",
    "shipped_files_table": "hf_tensorcompress.core.export:shipped_files_table",
    "common_options_table": common_options_table,
    "method_options_tables": method_options_tables,
    "config_reference": config_reference,
    "layer_reference": layer_reference,
}


def generated(name: str) -> str:
    """The table ``name`` names (an unknown name is an error, so a typo fails the strict build)."""
    maker = GENERATED[name]
    if isinstance(maker, str):
        module, _, function = maker.partition(":")
        maker = getattr(importlib.import_module(module), function)
    return maker()


def refreshed(markdown: str) -> str:
    """``markdown`` with the content of every generated block made again (markers kept): what the repository holds."""

    def block(match: re.Match) -> str:
        name = match.group(1)
        return f"<!-- generated: {name} -->\n\n{generated(name)}\n\n<!-- end generated: {name} -->"

    text = BLOCK.sub(block, markdown)
    stray = re.search(r"^<!-- (?:end )?generated: \w+ -->$", BLOCK.sub("", text), re.MULTILINE)
    if stray:
        raise ValueError(
            f"{stray.group(0)} has no partner: a generated block is <!-- generated: NAME --> … "
            "<!-- end generated: NAME -->"
        )
    return text


def render(markdown: str) -> str:
    """``markdown`` as the site shows it: every generated block made now, its markers dropped."""
    return BLOCK.sub(lambda match: generated(match.group(1)), refreshed(markdown))


def refresh(docs: Path = DOCS) -> list[Path]:
    """Rewrite the generated blocks of every page under ``docs`` that are out of date; returns those pages."""
    changed = []
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if refreshed(text) != text:
            page.write_text(refreshed(text), encoding="utf-8")
            changed.append(page)
    return changed


# ------------------------------------------------------------------------------------------- method pages in the nav
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


# ------------------------------------------------------------------------------------------- mkdocs events
def on_config(config):
    section = next(item["Methods"] for item in config["nav"] if isinstance(item, dict) and "Methods" in item)
    section += method_pages(Path(config["docs_dir"]), listed_pages(config["nav"]))
    return config


def on_page_markdown(markdown, page, config, files):
    return render(markdown)


if __name__ == "__main__":
    for page in refresh():
        print(f"refreshed {page.relative_to(DOCS.parent)}")
