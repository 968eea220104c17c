"""What makes a compressed model save with self-contained code: its class, ``auto_map``, ``compression_config``,
and the modeling files written next to the weights.

Which files ship is derived, not listed: the entry point ``modeling_tensorcompress.py``, the files defining the
method's layer and model-option classes (``Method.layers``, ``Method.options``), and every file those import from
this package, recursively; plus the optional runtime files (``runtime/optional.py``) the model uses
(``optional_files``): the C kernels where a layer stores packed codes, the torchao adapter where the Linears are
quantized. A checkpoint holds them flat (``runtime/contract.py`` → ``contract.py``,
``methods/tt/layer.py`` → ``tt_layer.py``, a file outside the package under its own name), which is the layout
``trust_remote_code`` loading needs; their imports of package files are rewritten to those flat names, and
``shipped_layers.py`` is written to import the layer files. A shipped file may import only torch, transformers and
other shipped files.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from pathlib import Path

import torch
import transformers
from torch import nn

from ..runtime.contract import QUANTIZATION_MARKER
from ..runtime.modeling_tensorcompress import compressed_class
from ..runtime.optional import OPTIONAL
from ..runtime.torchao_linears import linears_config
from .registry import Method

REMOTE_MODULE = "modeling_tensorcompress"
PACKAGE = Path(__file__).resolve().parent.parent
PACKAGE_NAME = PACKAGE.name
RUNTIME = PACKAGE / "runtime"
ENTRY = RUNTIME / f"{REMOTE_MODULE}.py"
MANIFEST = RUNTIME / "shipped_layers.py"

#: The manifest's function naming the optional files a checkpoint carries (their imports follow it).
CARRIED = (
    "\n\ndef carried_files() -> None:\n"
    '    """The optional runtime files this checkpoint carries (loaded on first use by ``optional.sibling``); the\n'
    '    imports below are how trust_remote_code knows to copy them. Not called."""\n'
)

#: ``from <relative or package module> import <names>`` lines, at any indentation.
_IMPORT = re.compile(rf"^(\s*)from (\.+[\w.]*|{PACKAGE_NAME}(?:\.\w+)*) import (\(?\s*)(\w+)", re.MULTILINE)


def flat_name(path: Path) -> str:
    """A shipped file's name inside a checkpoint."""
    try:
        parts = path.resolve().relative_to(PACKAGE).with_suffix("").parts
    except ValueError:
        return path.stem
    if parts[0] == "methods" and len(parts) == 3:
        return f"{parts[1]}_{parts[2]}"
    return parts[-1]


def _imported_file(path: Path, module: str, name: str = "") -> Path | None:
    """The file a ``from <module> import <name>`` line of ``path`` imports from, when it is a file of this package
    (``from hf_tensorcompress import <name>``: the module defining that public name)."""
    if module == PACKAGE_NAME:  # a public name of the package: the module that defines it
        defining = sys.modules[PACKAGE_NAME]._EXPORTS.get(name)
        if defining is None:
            return None
        module = PACKAGE_NAME + defining
    if module.startswith("."):
        dots = len(module) - len(module.lstrip("."))
        base = path.resolve().parent
        for _ in range(dots - 1):
            base = base.parent
        parts = [part for part in module.lstrip(".").split(".") if part]
    else:
        base, parts = PACKAGE, module.split(".")[1:]
    target = base.joinpath(*parts)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def optional_files(model: nn.Module) -> tuple[str, ...]:
    """The optional runtime files a checkpoint of ``model`` needs: ``lowbit_kernel`` where a layer, as loaded from its
    spec, holds packed codes (``LowBitTensor``, ``CodebookTensor``); ``torchao_linears`` (and the ``bnb_linears`` it
    imports) where torchao or bitsandbytes quantized the other Linears."""
    from ..runtime.codebook import CodebookTensor
    from ..runtime.contract import CompressedLayer
    from ..runtime.lowbit import LowBitTensor

    needed = []
    with torch.device("meta"):  # the stored form of each layer, as a checkpoint rebuilds it, without memory
        stored = [
            CompressedLayer.types[spec["type"]].from_spec(spec)
            for spec in model.config.compression_config["modules"].values()
        ]
    if any(isinstance(part, (LowBitTensor, CodebookTensor)) for layer in stored for part in layer.modules()):
        needed.append("lowbit_kernel")
    if linears_config(getattr(model.config, "quantization_config", None)) is not None:
        needed.append("torchao_linears")
    return tuple(needed)


def shipped_files(methods: list[Method], optional: tuple[str, ...] = ()) -> dict[Path, str]:
    """Every file a checkpoint of ``methods`` ships: the entry point, the files of their layer and option classes,
    every package file those import, recursively, and the ``optional`` runtime files; ``{path: flat module name}``."""
    unknown = sorted(set(optional) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"optional runtime files {unknown} do not exist; there are {list(OPTIONAL)}")
    pending = [ENTRY] + [Path(inspect.getsourcefile(cls)).resolve() for m in methods for cls in (*m.layers, *m.options)]
    pending += [RUNTIME / f"{name}.py" for name in optional]
    files: dict[Path, str] = {}
    while pending:
        path = pending.pop()
        if path in files:
            continue
        files[path] = flat_name(path)
        text = path.read_text(encoding="utf-8")
        pending += [f for f in (_imported_file(path, m.group(2), m.group(4)) for m in _IMPORT.finditer(text)) if f]
    names = sorted(files.values())
    clashes = {name for name in names if names.count(name) > 1}
    if clashes:
        raise ValueError(f"shipped files would share the checkpoint names {sorted(clashes)}; rename one of them")
    return files


def shipped_source(path: Path, files: dict[Path, str], methods: list[Method]) -> str:
    """The text of shipped file ``path`` as a checkpoint holds it: imports of package files point at the flat
    names; the layer manifest imports the layer files of ``methods`` and the optional runtime files shipped (so that
    ``trust_remote_code`` copies them)."""
    if path == MANIFEST:
        classes = list(dict.fromkeys(cls for m in methods for cls in (*m.layers, *m.options)))
        docstring = path.read_text(encoding="utf-8").split('"""')[1]
        imports = [
            f"from .{files[Path(inspect.getsourcefile(cls)).resolve()]} import {cls.__name__}" for cls in classes
        ]
        carried = [name for name in OPTIONAL if RUNTIME / f"{name}.py" in files]
        names = "".join(f"{cls.__name__}, " for cls in classes)
        text = f'"""{docstring}"""\n\n' + "\n".join(imports) + f"\n\nLAYER_CLASSES = ({names})\n"
        return (
            text
            + (CARRIED if carried else "")
            + "".join(f"    from .{name} import __name__ as _{name}  # noqa: F401\n" for name in carried)
        )

    def rewrite(match: re.Match) -> str:
        indent, module, opening, name = match.groups()
        target = _imported_file(path, module, name)
        if target is None or target not in files:
            raise ValueError(
                f"shipped file {path} imports {module}, which is not shipped (torch and transformers only)"
            )
        return f"{indent}from .{files[target]} import {opening}{name}"

    return _IMPORT.sub(rewrite, path.read_text(encoding="utf-8"))


def write_modeling_code(folder: str | os.PathLike, methods: list[Method], optional: tuple[str, ...] = ()) -> list[Path]:
    """Write the shipped files of ``methods`` (and the ``optional`` runtime files) into ``folder``, flat; returns the
    written paths."""
    files = shipped_files(methods, optional)
    written = []
    for path, name in files.items():
        target = Path(folder) / f"{name}.py"
        target.write_text(shipped_source(path, files, methods), encoding="utf-8")
        written.append(target)
    return written


@functools.cache
def _auto_model_for_names() -> tuple[str, ...]:
    """transformers' ``AutoModelFor*`` names (``dir(transformers)`` takes about half a second: read once)."""
    return tuple(name for name in dir(transformers) if name.startswith("AutoModelFor"))


def auto_classes_for(base: type[nn.Module], config) -> list[str]:
    """``AutoModel`` plus every ``AutoModelFor*`` whose mapping resolves this config to ``base``."""
    names = ["AutoModel"]
    for name in _auto_model_for_names():
        mapping = getattr(getattr(transformers, name), "_model_mapping", None)
        try:
            if mapping is not None and mapping[type(config)] is base:
                names.append(name)
        except (KeyError, ValueError, ImportError, AttributeError):
            continue
    return names


def mark_compressed(model: nn.Module, recorded: dict, save_hook=None) -> None:
    """Make ``model`` a ``Compressed<Class>`` (with ``save_hook``, see ``compressed_class``), record the config
    (``recorded``: a ``CompressionConfig.to_dict()``), point ``auto_map`` at the shipped code and
    ``quantization_config`` at the library's transformers quantizer (native loading)."""
    base = type(model)
    model.__class__ = compressed_class(base, save_hook)
    model.config.compression_config = recorded
    model.config.quantization_config = dict(QUANTIZATION_MARKER)
    class_name = model.__class__.__name__
    auto_map = dict(getattr(model.config, "auto_map", None) or {})
    auto_map.update({auto: f"{REMOTE_MODULE}.{class_name}" for auto in auto_classes_for(base, model.config)})
    model.config.auto_map = auto_map


def shipped_files_table() -> str:
    """The documentation's table of the files each method's checkpoints ship, made from the code (``shipped_files``),
    with the optional runtime files and when a checkpoint carries them."""
    from .registry import get_method, records

    files = {name: set(shipped_files([get_method(name)]).values()) for name in records()}
    common = set.intersection(*files.values())

    def listed(names) -> str:
        return ", ".join(f"`{name}.py`" for name in sorted(names)) or "—"

    rows = ["| checkpoint | files it ships (besides `config.json`, the weights and the card) |", "|---|---|"]
    rows.append(f"| every one | {listed(common)} |")
    rows += [f"| method `{name}` | {listed(own - common)} |" for name, own in files.items()]
    everywhere = set(shipped_files([]).values())
    for when, optional in (
        ("a layer stores packed codes (`LowBitTensor`, `CodebookTensor`)", "lowbit_kernel"),
        ("the other Linears quantized with torchao or bitsandbytes (`quantize_linears`)", "torchao_linears"),
    ):
        rows.append(f"| {when} | {listed(set(shipped_files([], (optional,)).values()) - everywhere)} |")
    return "\n".join(rows)
