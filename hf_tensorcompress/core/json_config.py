"""The JSON round trip of a config dataclass, written once for ``CompressionConfig`` and ``SearchConfig``.

A leaf module (it imports only ``json``), so both configs import it without reaching above themselves.
"""

from __future__ import annotations

import json
from typing import TypeVar

Config = TypeVar("Config", bound="JsonConfig")


class JsonConfig:
    """``to_json_*`` / ``from_json_*`` on top of the class's own ``to_dict()`` and ``from_dict(data)``."""

    def to_json_string(self, use_diff: bool = True) -> str:
        """The JSON of ``to_dict()`` (``use_diff`` is transformers' signature; every field is written)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json_string(cls: type[Config], text: str) -> Config:
        return cls.from_dict(json.loads(text))

    def to_json_file(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.to_json_string() + "\n")

    @classmethod
    def from_json_file(cls: type[Config], path: str) -> Config:
        with open(path, encoding="utf-8") as handle:
            return cls.from_json_string(handle.read())
