"""Every ```python block of README.md runs, so the documentation cannot rot.

Blocks run in order with ``exec`` in a fresh namespace, in a temporary working directory (files a block writes land
there). An HTML comment on the line before a block (invisible on GitHub) changes how it runs:

- ``<!-- readme-test: continues -->``: runs after the previous python block of the same section, in its namespace
  (the two are one test);
- ``<!-- readme-test: slow -->``: the block is in the slow tier (real models, long training): ``make test-slow``;
- ``<!-- readme-test: hub -->``: the block talks to the Hub: it runs against the Hub emulator (``tests/hub_emulator.py``)
  with the README's user ``me`` standing for the emulator's user.

Console and bash blocks are not executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FLAG = re.compile(r"<!--\s*readme-test:\s*([a-z ,]+?)\s*-->")


@dataclass
class Block:
    section: str
    line: int
    code: str
    flags: set[str] = field(default_factory=set)


def python_blocks(text: str) -> list[Block]:
    """The README's python blocks with their section (the last ``##`` heading) and flags."""
    blocks, section, lines, index = [], "", text.splitlines(), 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip().startswith("```python"):
            start, body = index + 1, []
            index += 1
            while not lines[index].strip().startswith("```"):
                body.append(lines[index])
                index += 1
            previous = next((l for l in reversed(lines[: start - 1]) if l.strip()), "")
            match = FLAG.search(previous)
            flags = {flag.strip() for flag in match.group(1).split(",")} if match else set()
            blocks.append(Block(section, start + 1, "\n".join(body) + "\n", flags))
        index += 1
    return blocks


def chains(blocks: list[Block]) -> list[list[Block]]:
    """Blocks grouped into tests: a ``continues`` block joins the previous block of its section."""
    groups: list[list[Block]] = []
    for block in blocks:
        if "continues" in block.flags:
            assert groups and groups[-1][-1].section == block.section, (
                f"README.md:{block.line}: 'continues' needs an earlier python block in section {block.section!r}")
            groups[-1].append(block)
        else:
            groups.append([block])
    return groups


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


GROUPS = chains(python_blocks(README.read_text(encoding="utf-8")))
PARAMS = [
    pytest.param(group, id=f"{_slug(group[0].section)}-line{group[0].line}",
                 marks=[pytest.mark.slow, pytest.mark.timeout(3600)] if any("slow" in b.flags for b in group) else [])
    for group in GROUPS
]


@pytest.mark.parametrize("group", PARAMS)
def test_readme_python_block_runs(group: list[Block], tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for block in group:
        code = block.code
        if "hub" in block.flags:
            hub = request.getfixturevalue("hub")
            code = code.replace('"me/', f'"{hub.USER}/')
        exec(compile(code, f"{README}:{block.line}", "exec"), namespace)  # noqa: S102 - the README's own examples


def test_readme_documents_every_method_and_no_outside_files():
    text = README.read_text(encoding="utf-8")
    for method in ("cp", "svd", "biprop", "tt", "tiered"):
        assert f'method="{method}"' in text, method
    assert "DESIGN" + ".md" not in text  # no references to documents outside the repository
    for section in ("Install", "Quick start", "Methods", "Smartformer", "Command line", "Hub", "Data", "Benchmarks",
                    "Tests", "Layout"):
        assert re.search(rf"^## .*{section}", text, re.M), section
    assert len(GROUPS) >= 8
