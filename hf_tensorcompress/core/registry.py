"""The method registry, keyed by config type, as torchao looks up a handler by its config's class.

A method is known by a light ``MethodRecord`` (its name, config class and build code by import path, a description
and an example config) that its package's ``__init__.py`` registers without importing torch; its build code, the
``Method``, loads on first use. ``method_for(config)`` resolves a config to its ``Method`` once; ``config_class``
gives the options class of a name (the command line's flags, ``CompressionConfig(method=...)``). A method defined
outside the library registers its ``Method`` directly (``register_method(Method(...))``).

Discovery: ``add_method_package(name)`` names a package whose subpackages each register one method when imported
(the library adds its ``methods`` package); they are imported once, at the first lookup. This module names no
method and imports nothing of the package above it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # no torch at import: the command line reads the registry for its flags
    from torch import nn

#: ``build(model, name, module, config, calibration) -> layer``: must not modify ``model``.
Builder = Callable[["nn.Module", str, "nn.Module", Any, Any], "nn.Module"]


@dataclass(frozen=True)
class Method:
    """One compression method's build code.

    ``config_class`` holds its options (a ``CompressionConfig`` subclass); ``default_targets(model)`` lists full
    module names to compress when the config names none; ``build`` returns the replacement layer; ``accepts`` are
    the module types it can replace; ``keywords`` maps a one-word ``target_modules`` (e.g. ``"all-linear"``) to a
    function listing its targets; ``model_options(model, config)`` validates and resolves model-level options
    (recorded in ``compression_config``) without touching the model; ``prepare(model, config, calibration)``
    checks and condenses calibration data once, before any layer is built (its result reaches every ``build``);
    ``reads_weights(config)`` says whether ``build`` computes the layer from the dense weights (then it cannot run on
    a model whose weights are on the meta device, i.e. not loaded); ``layers`` and ``options`` are the
    ``CompressedLayer`` and ``ModelOption`` classes its checkpoints may name: their files (and what those import
    from the package) ship inside every checkpoint of the method; ``calibrate(model, config, token_ids,
    covariance_tokens)`` turns calibration text into what ``prepare`` takes, for methods that use calibration text
    (``apply_calibrated``, the command line's ``--calibration``).
    """

    name: str
    config_class: type
    default_targets: Callable[[nn.Module], list[str]]
    build: Builder
    accepts: tuple[type[nn.Module], ...] = ()
    keywords: dict[str, Callable[[nn.Module], list[str]]] = field(default_factory=dict)
    model_options: Callable[[nn.Module, Any], dict] | None = None
    prepare: Callable[[nn.Module, Any, Any], Any] | None = None
    reads_weights: Callable[[Any], bool] = lambda config: True
    layers: tuple[type[nn.Module], ...] = ()
    options: tuple[type, ...] = ()
    calibrate: Callable[[nn.Module, Any, Any, int], Any] | None = None


@dataclass(frozen=True)
class MethodRecord:
    """What the registry knows of a method before its build code loads.

    ``config`` and ``build`` are ``"module:attribute"`` paths of its ``CompressionConfig`` subclass and of its
    ``Method``; ``description`` is one line for model cards and ``--help``; ``example`` the options of a typical
    config (``CompressionConfig(method=name, **example)``); ``default``: the method ``CompressionConfig()`` takes
    when it names none (one method says so).
    """

    name: str
    config: str
    build: str
    description: str
    example: dict = field(default_factory=dict)
    default: bool = False


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _path(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


class Registry:
    """Method records by name and by config class path, the methods loaded so far, and the packages to discover."""

    def __init__(self) -> None:
        self._records: dict[str, MethodRecord] = {}
        self._by_config: dict[str, str] = {}
        self._methods: dict[str, Method] = {}
        self._packages: list[str] = []
        self._discovered: set[str] = set()

    def add_method_package(self, package: str) -> None:
        """Discover ``package``'s subpackages (each registers one method when imported) at the next lookup."""
        if package not in self._packages:
            self._packages.append(package)

    def _discover(self) -> None:
        for package in self._packages:
            if package in self._discovered:
                continue
            self._discovered.add(package)
            for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
                if info.ispkg:
                    importlib.import_module(f"{package}.{info.name}")

    def register(self, entry: MethodRecord | Method) -> MethodRecord | Method:
        """Add a method: a ``MethodRecord`` (build code loaded on first use) or a ``Method`` (already loaded). A
        second method of the same name or config class is refused; registering the same entry again is a no-op."""
        method = entry if isinstance(entry, Method) else None
        record = _record_of(entry) if method else entry
        if method is not None:
            check_method(method)
        existing = self._records.get(record.name)
        if existing is not None and existing != record:
            raise ValueError(f"a method named {record.name!r} is already registered (config {existing.config})")
        owner = self._by_config.get(record.config)
        if owner is not None and owner != record.name:
            raise ValueError(f"config class {record.config} already configures method {owner!r}")
        if record.default and any(r.default and r.name != record.name for r in self._records.values()):
            raise ValueError(f"method {record.name!r} cannot be the default: {self.default_name()!r} is")
        if method is not None and self._methods.get(record.name, method) != method:
            raise ValueError(f"a method named {record.name!r} is already registered")
        self._records[record.name] = record
        self._by_config[record.config] = record.name
        if method is not None:
            self._methods[record.name] = method
        return entry

    def records(self) -> dict[str, MethodRecord]:
        """Every method's record by name (discovering the method packages first)."""
        self._discover()
        return dict(sorted(self._records.items()))

    def record(self, name: str) -> MethodRecord:
        """The record of method ``name``; an error lists the registered ones."""
        records = self.records()
        if not isinstance(name, str) or name not in records:
            raise ValueError(f"method={name!r} is not supported; choose one of {sorted(records)}")
        return records[name]

    def default_name(self) -> str:
        """The method a config that names none takes."""
        return next((name for name, record in self.records().items() if record.default), "")

    def config_class(self, name: str) -> type:
        """The options class of method ``name`` (imports its config module only)."""
        return _load(self.record(name).config)

    def method(self, name: str) -> Method:
        """The build code of method ``name``, loaded on first use."""
        record = self.record(name)
        if name not in self._methods:
            method = _load(record.build)
            check_method(method)
            if _path(method.config_class) != record.config:
                raise ValueError(f"method {name!r}: its Method's config class is not {record.config}")
            self._methods[name] = method
        return self._methods[name]

    def method_for(self, config: Any) -> Method:
        """The ``Method`` of ``config``, looked up by its class."""
        self._discover()
        name = self._by_config.get(_path(type(config)))
        if name is None:
            raise ValueError(
                f"{type(config).__name__} is the config of no registered method; configs: "
                f"{sorted(record.config.rpartition(':')[2] for record in self._records.values())}"
            )
        return self.method(name)


def _record_of(method: Method) -> MethodRecord:
    doc = (method.config_class.__doc__ or method.name).strip().splitlines()[0]
    return MethodRecord(method.name, _path(method.config_class), "", doc)


def check_method(method: Method) -> None:
    """A ``Method`` the registry can use: its config class names it, and it replaces and ships something."""
    if getattr(method.config_class, "method_name", None) != method.name:
        raise ValueError(
            f"Method {method.name!r}: its config class {method.config_class.__name__} must set "
            f"method_name = {method.name!r} (the name configs and checkpoints use)"
        )
    if not method.accepts:
        raise ValueError(f"Method {method.name!r} names no module types it replaces (accepts=...)")
    if not method.layers:
        raise ValueError(f"Method {method.name!r} names no layer classes (layers=...): its checkpoints could not load")


#: The library's registry: every lookup goes through it.
REGISTRY = Registry()
register_method = REGISTRY.register
add_method_package = REGISTRY.add_method_package
records = REGISTRY.records
record = REGISTRY.record
default_name = REGISTRY.default_name
config_class = REGISTRY.config_class
get_method = REGISTRY.method
method_for = REGISTRY.method_for


def methods_table() -> str:
    """The documentation's table of methods, made from the registry (a test keeps the docs equal to it)."""
    rows = ["| method | config | layers (in checkpoints) | replaces |", "|---|---|---|---|"]
    for name in records():
        method = get_method(name)
        layers = ", ".join(f"`{cls.__name__}`" for cls in method.layers)
        accepts = ", ".join(f"`{cls.__name__}`" for cls in method.accepts)
        rows.append(f"| `{name}` | `{method.config_class.__name__}` | {layers} | {accepts} |")
    return "\n".join(rows)
