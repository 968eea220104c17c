"""The ```python blocks of a markdown file (the README, the pages of the docs site) as tests.

Blocks run in order with ``exec`` in a fresh namespace, in a temporary working directory (files a block writes land
there). An HTML comment on the line before a block (invisible on GitHub and on the site) changes how it runs; the
prefix is ``docs-test:`` or, the same, ``readme-test:``:

- ``<!-- docs-test: continues -->``: runs after the previous python block of the same ``##`` section of the same
  file, in its namespace (the two are one test);
- ``<!-- docs-test: slow -->``: the block is in the slow tier (real models, long training): ``make test-slow``, which
  runs it only as a script in reading order (``test_journeys.py``), not also with ``exec`` here;
- ``<!-- docs-test: hub -->``: the block talks to the Hub: it runs against the Hub emulator (``tests/hub_emulator.py``)
  with the user ``me`` standing for the emulator's user.

Flags combine with commas (``<!-- docs-test: continues, slow -->``). Console, bash and unlabelled blocks are not
executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"<!--\s*(?:docs|readme)-test:\s*([a-z ,]+?)\s*-->")
FLAGS = {"continues", "slow", "hub"}


@dataclass
class Block:
    path: Path
    section: str
    line: int
    code: str
    flags: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """The file's python blocks with their section (the last ``##`` heading) and flags."""
    blocks, section, lines, index = [], "", path.read_text(encoding="utf-8").splitlines(), 0
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
            previous = next((text for text in reversed(lines[: start - 1]) if text.strip()), "")
            match = FLAG.search(previous)
            flags = {flag.strip() for flag in match.group(1).split(",")} if match else set()
            unknown = flags - FLAGS
            assert not unknown, f"{path.relative_to(ROOT)}:{start}: unknown test flag(s) {sorted(unknown)}"
            blocks.append(Block(path, section, start + 1, "\n".join(body) + "\n", flags))
        index += 1
    return blocks


def chains(blocks: list[Block]) -> list[list[Block]]:
    """Blocks grouped into tests: a ``continues`` block joins the previous block of its file and section."""
    groups: list[list[Block]] = []
    for block in blocks:
        if "continues" in block.flags:
            assert groups and groups[-1][-1].path == block.path and groups[-1][-1].section == block.section, (
                f"{block.where}: 'continues' needs an earlier python block in section {block.section!r}"
            )
            groups[-1].append(block)
        else:
            groups.append([block])
    return groups


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


def params(paths: list[Path]) -> list:
    """One pytest param per chain of blocks of ``paths`` without a ``slow`` block (slow chains run as scripts only:
    ``test_journeys.py``)."""
    result = []
    for path in paths:
        for group in chains(python_blocks(path)):
            if any("slow" in block.flags for block in group):
                continue
            name = _slug(str(path.relative_to(ROOT).with_suffix("")))
            result.append(pytest.param(group, id=f"{name}-{_slug(group[0].section) or 'top'}-line{group[0].line}"))
    return result


def run(group: list[Block], tmp_path: Path, monkeypatch, request) -> None:
    """Run one chain of blocks in a fresh namespace inside ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for block in group:
        code = block.code
        if "hub" in block.flags:
            hub = request.getfixturevalue("hub")
            code = code.replace('"me/', f'"{hub.USER}/')
        exec(compile(code, str(block.path) + f":{block.line}", "exec"), namespace)  # noqa: S102 - the docs' examples
