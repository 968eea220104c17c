"""Every ``CompressionConfig`` field as a ``compress`` flag, and the config those flags (and ``--config``) make.

Built from the registered method configs (plain dataclasses, no torch), so a new method's options need no change
here and ``--help`` lists each with its description and allowed values.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
from dataclasses import Field, fields
from pathlib import Path

from ..config import CompressionConfig, config_class, config_classes
from ..core import registry
from .common import UsageError

#: characters that make a single --target-modules value a regular expression rather than a module name
REGEX_CHARACTERS = "*+?[](){}|\\^$"


def config_flags() -> dict[str, tuple[Field, tuple[str, ...]]]:
    """Every user-settable field of every method's config, with the methods that take it: each becomes a flag, so a
    new method's options need no CLI change."""
    flags: dict[str, tuple] = {}
    for method, cls in config_classes().items():
        for item in fields(cls):
            if item.name not in ("modules", "version"):
                flags[item.name] = (item, flags.get(item.name, (None, ()))[1] + (method,))
    return flags


def field_descriptions(cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Args:`` sections of ``cls``'s docstring and its bases' (the config
    classes document every option there, allowed values included), so ``--help`` says what each flag takes."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        lines = inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines()
        inside, name = False, None
        for line in lines:
            if line.strip() == "Args:":
                inside = True
                continue
            entry = re.match(r"^ {4}(\w+): (.*)$", line)
            if inside and entry:
                name = entry.group(1)
                found[name] = entry.group(2)
            elif inside and name and line.startswith(" " * 8):
                found[name] += " " + line.strip()
            elif inside and line.strip():
                inside, name = False, None
    return {key: text.replace("``", "").replace("%", "%%") for key, text in found.items()}


def choices_metavar(item: Field) -> str:
    """``{nearest,output}`` for a field with a fixed set of values (``config.one_of``), else ``VALUE``."""
    choices = item.metadata.get("choices")
    return "{" + ",".join(map(str, choices)) + "}" if choices else "VALUE"


def allowed_values(item: Field, prefix: str = "") -> str:
    """The help's note of a field's allowed values, from the config class (the tuple its validation checks)."""
    choices = item.metadata.get("choices")
    return f"; {prefix}one of {', '.join(map(str, choices))}" if choices else ""


def is_list(item: Field) -> bool:
    """Whether a config field holds a list (its annotation names ``list[...]``)."""
    return "list[" in str(item.type)


def scalar(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def list_value(item: Field, values: list[str]):
    """A list-valued flag from the command line: ``8 8 9``, ``8,8,9`` and ``[8, 8, 9]`` all give ``[8, 8, 9]``.

    One value that parses as JSON is taken as it is (a list, or a scalar where the field also takes one, like
    ``--tt-ranks 5``); one ``--target-modules`` value with regex characters is a regular expression; otherwise every
    value is split at commas and each element read as JSON where it parses (numbers), else as text.
    """
    if len(values) == 1:
        text = values[0].strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                if item.name != "target_modules":
                    raise UsageError(f"--{item.name.replace('_', '-')} {text}: not a JSON list") from None
        if item.name == "target_modules" and any(c in text for c in REGEX_CHARACTERS):
            return text
        alternatives = [part.strip() for part in str(item.type).split("|")]
        scalar_too = any(not a.startswith("list[") and a not in ("None", "str") for a in alternatives)
        if "," not in text and scalar_too:  # a string target_modules means a regex: one plain name stays a list
            return scalar(text)  # e.g. --tt-ranks 5 (one rank for every bond)
    parts = [part.strip() for value in values for part in value.split(",")]
    if not all(parts):
        raise UsageError(f"--{item.name.replace('_', '-')} {' '.join(values)}: empty element in the list")
    return [scalar(part) if item.name != "target_modules" else part for part in parts]


def compression_config(args: argparse.Namespace) -> CompressionConfig:
    """The ``CompressionConfig`` from ``--config`` and/or the per-field flags (flags win)."""
    data = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise UsageError(f"--config {path} does not exist; pass a JSON file of CompressionConfig fields")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise UsageError(f"--config {path} is not valid JSON: {error}") from None
    given = []
    for name, (item, _) in config_flags().items():
        value = getattr(args, name)
        if value is not None:
            data[name] = list_value(item, value) if is_list(item) else scalar(value)
            given.append(name)
    try:
        cls = config_class(data.get("method"))
    except ValueError:
        cls = None  # an unknown method: from_dict below names the ones there are
    foreign = [name for name in given if cls is not None and name not in cls.field_names()]
    if foreign:  # a flag of another method is a mistake (a --config file may hold version-1 fields of every method)
        raise ValueError(cls._foreign_fields_message(foreign))
    return CompressionConfig.from_dict(data)


def method_of(args: argparse.Namespace) -> str:
    """The method a compress command asked for: ``--method``, else the ``--config`` file's, else the default."""
    if args.method:
        return str(scalar(args.method))
    try:
        data = json.loads(Path(args.config).read_text(encoding="utf-8")) if args.config else {}
    except (OSError, json.JSONDecodeError):
        data = {}
    return data.get("method", registry.default_name()) if isinstance(data, dict) else registry.default_name()


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per config field, with its description, methods, default and allowed values."""
    descriptions = {}
    for cls in config_classes().values():
        descriptions = field_descriptions(cls) | descriptions  # the first class documenting a field keeps it
    for name, (item, methods) in config_flags().items():
        about = descriptions.get(name, name)
        flag = "--" + name.replace("_", "-")
        default = item.default if not callable(item.default_factory) else item.default_factory()
        if name == "target_modules":
            parser.add_argument(
                flag,
                nargs="+",
                metavar="NAME",
                help="module names (space- or comma-separated, or a JSON list) or one regex to "
                "compress (default: the method's targets)",
            )
        elif is_list(item):
            parser.add_argument(
                flag,
                nargs="+",
                metavar=choices_metavar(item),
                help=f"{'/'.join(methods)}: {about} A list: space- or comma-separated values or one JSON list "
                f"(default: {default!r}){allowed_values(item, 'each value: ')}",
            )
        elif name == "method":
            about = "; ".join(f"{name}: {record.description}" for name, record in registry.records().items())
            parser.add_argument(
                flag, metavar="VALUE", help=f"one of {list(methods)} (default: {registry.default_name()!r}). {about}"
            )
        else:
            parser.add_argument(
                flag,
                metavar=choices_metavar(item),
                help=f"{'/'.join(methods)}: {about} (default: {default!r}){allowed_values(item)}",
            )
