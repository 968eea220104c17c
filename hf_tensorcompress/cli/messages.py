"""Errors in the command line's terms: the library's messages name config fields (``tier_group_size=7``,
``rounding='best'``) where a command-line user typed flags (``--tier-group-size 7``, ``--rounding best``).

Rewritten: ``field=value`` (a field of any method's config) and the field names themselves where they cannot be read
as plain words (names with an underscore; one-word names only before "must"). A generic check's bare name
(``group_size=7`` from the low-bit storage) is the flag of the method's one option ending in it
(``--tier-group-size`` for tiered, ``--factor-group-size`` for cp/svd); left as it is where none or several do.
"""

from __future__ import annotations

import re
from collections.abc import Collection

#: A value as the library's messages print it (``repr``): a quoted string, a list, a dict, or one token.
_VALUE = r"""('[^']*'|"[^"]*"|\[[^\]]*\]|\{[^}]*\}|[^\s,;:)]+)"""
#: Not inside a longer name, path, module name or flag.
_BEFORE = r"(?<![\w./-])"


def flag(name: str) -> str:
    """The command-line flag of config field ``name``."""
    return "--" + name.replace("_", "-")


def _typed(value: str) -> str:
    """A value as it is typed after its flag: strings without their quotes."""
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value


def in_flag_terms(message: str, fields: Collection[str], method_fields: Collection[str] = ()) -> str:
    """``message`` with the config fields it names (``fields``: every flag's field) written as flags;
    ``method_fields``: the options of the method being compressed, which a generic check's bare name refers to."""
    names = {name: name for name in fields}
    for bare in set(re.findall(_BEFORE + r"([a-z]+(?:_[a-z]+)*)=", message)) - set(names):
        owners = [name for name in method_fields if name.endswith("_" + bare)]
        if len(owners) == 1:
            names[bare] = owners[0]
    for name in sorted(names, key=len, reverse=True):  # tier_group_size before group_size
        target = flag(names[name])
        message = re.sub(
            _BEFORE + re.escape(name) + "=" + _VALUE, lambda m, target=target: f"{target} {_typed(m.group(1))}", message
        )
        words = re.escape(name) + (r"(?![\w/=]|\.\w)" if "_" in name else r"(?= must\b)")
        message = re.sub(_BEFORE + words, target, message)
    return message
