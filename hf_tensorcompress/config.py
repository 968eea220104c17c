"""``CompressionConfig``: the public entry for every method's options; validated, versioned, JSON round trip.

``CompressionConfig(method="cp", rank=0.5)`` returns the method's own config (``CPConfig`` here): each method keeps
its options in its own typed dataclass (``methods/<method>/config.py``), found through the method registry, and an
option of another method is an error that names the config it belongs to. Checkpoints store ``to_dict()``;
``from_dict`` also reads the single flat config that version 1 wrote for every method.

The configs import neither torch nor transformers (the command line builds its flags from them): a config is a
transformers quantization config by protocol, not by base class. It offers what transformers calls on one
(``quant_method``, ``to_dict``, ``to_diff_dict``, ``to_json_string``, ``to_json_file``, ``update``, ``dict(config)``),
as ``QuantizationConfigMixin`` does, so ``from_pretrained(dense, quantization_config=config)`` compresses while
loading.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from .core import registry
from .core.json_config import JsonConfig
from .runtime.marker import QUANT_METHOD

#: 2: one config per method, only its own fields are written. 1: one flat config holding every method's fields.
CONFIG_VERSION = 2


def config_classes() -> dict[str, type[CompressionConfig]]:
    """Every registered method's config class by method name (imports the config modules only)."""
    return {name: registry.config_class(name) for name in registry.records()}


def config_class(method: str | None) -> type[CompressionConfig]:
    """The config class of ``method`` (None: the registry's default method); an error lists the methods there are."""
    return registry.config_class(registry.default_name() if method is None else method)


def _owner_of(name: str) -> type[CompressionConfig] | None:
    return next((cls for cls in config_classes().values() if name in cls.field_names()), None)


@dataclass
class CompressionConfig(JsonConfig):
    """How ``apply_compression`` rewrites a model; calling it returns the config of ``method``.

    It is also a transformers quantization config: ``Model.from_pretrained(dense, quantization_config=config)``
    compresses while loading (``hf_tensorcompress.quantizer``).

    Args:
        method: a registered method's name (``hf_tensorcompress.core.registry.records()`` lists them; the docs'
            options page has the table); the other keyword arguments are that method's options (its config class).
            Not given: the registry's default method.
        target_modules: module names (a module matches if its full name equals or ends with ``.<name>``) or one
            regular expression matched against full names. ``None`` takes the method's default for the model
            family (attention projections for cp/svd/biprop, the input embedding for tt and tiered).
        modules: filled by ``apply_compression``: the resolved spec of every replaced module (type, shapes, rank).
            A saved checkpoint is rebuilt from it; leave it empty when writing a config by hand.
        version: the format of the saved config, set by the library: 2 writes each method's own fields; a version-1
            dict (one flat config of every method's fields) still loads.
    """

    method: str = ""
    target_modules: list[str] | str | None = None
    modules: dict[str, dict] = field(default_factory=dict)
    version: int = CONFIG_VERSION

    #: The method this class configures (set by each subclass).
    method_name: ClassVar[str] = ""
    #: Fields of this config that a version-1 dict (one flat config for every method) held for another method.
    version_1_foreign: ClassVar[tuple[str, ...]] = ()
    #: What transformers dispatches ``quantization_config`` on (not a field: never written to compression_config).
    quant_method: ClassVar[str] = QUANT_METHOD

    def __new__(cls, *args: Any, **kwargs: Any) -> CompressionConfig:
        if cls is CompressionConfig:
            cls = config_class(args[0] if args else kwargs.get("method"))
        unknown = [name for name in kwargs if name not in cls.field_names()]
        if unknown:
            raise ValueError(cls._foreign_fields_message(unknown))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def _foreign_fields_message(cls, names: list[str]) -> str:
        parts = []
        for name in names:
            owner = _owner_of(name)
            where = (
                f"an option of {owner.__name__} (method={owner.method_name!r})"
                if owner
                else "not an option of any method"
            )
            parts.append(f"{name!r} is {where}")
        own = sorted(cls.field_names() - {"modules", "version"})
        return f"{cls.__name__} (method={cls.method_name!r}) has no such option: {'; '.join(parts)}. It takes: {own}"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the wrong field and what would be right."""
        if self.method == "":
            self.method = self.method_name
        if self.method != self.method_name:
            raise ValueError(
                f"{type(self).__name__} configures method={self.method_name!r}, not {self.method!r}; "
                f"use CompressionConfig(method={self.method!r}, ...)"
            )
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version > CONFIG_VERSION:
            raise ValueError(
                f"CompressionConfig version {self.version!r} is newer than this library understands "
                f"({CONFIG_VERSION}); upgrade hf_tensorcompress"
            )
        self.version = CONFIG_VERSION
        if self.target_modules is None:
            return
        if isinstance(self.target_modules, str):
            try:
                re.compile(self.target_modules)
            except re.error as error:
                raise ValueError(f"target_modules={self.target_modules!r} is not a valid regex: {error}") from None
        elif (
            isinstance(self.target_modules, (list, tuple))
            and self.target_modules
            and all(isinstance(name, str) and name for name in self.target_modules)
        ):
            self.target_modules = list(self.target_modules)
        else:
            raise ValueError(
                f"target_modules must be a non-empty list of module names, a regex string, or None for the "
                f"model family's default; got {self.target_modules!r}"
            )

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompressionConfig:
        """The config ``data`` describes. Version 1 dicts held every method's fields (the other methods' unused): those
        are dropped; in a version 2 dict another method's field is an error naming the config it belongs to."""
        if not isinstance(data, dict):
            raise TypeError(
                f"from_dict takes a dict such as {{'method': 'cp', 'rank': 0.5}}, got {type(data).__name__}; "
                "for JSON text use CompressionConfig.from_json_string"
            )
        data = dict(data)
        if "method" in data and not isinstance(data["method"], str):
            raise ValueError(f"method must be a string naming a method, got {data['method']!r}")
        target = config_class(data.get("method")) if cls is CompressionConfig else cls
        version = data.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"version must be an int (this library writes {CONFIG_VERSION}), got {version!r}")
        if version < 2:
            own = target.field_names() - set(target.version_1_foreign)
            data = {key: value for key, value in data.items() if key in own or not _owner_of(key)}
        return target(**data)

    def to_diff_dict(self) -> dict[str, Any]:
        """transformers' name for what ``config.json`` records: every field (``to_dict``)."""
        return self.to_dict()

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """``dict(config)``, which transformers uses where a quantization config may be a dict or a config."""
        yield from copy.deepcopy(self.to_dict()).items()

    def update(self, **kwargs: Any) -> dict[str, Any]:
        """Set the given fields (validated again); returns the keyword arguments that are not fields."""
        own = self.field_names()
        for key, value in kwargs.items():
            if key in own:
                setattr(self, key, value)
        self.validate()
        return {key: value for key, value in kwargs.items() if key not in own}


def as_config(value: Any) -> CompressionConfig:
    """``value`` as a validated config: a ``CompressionConfig``, a dict (``CompressionConfig.from_dict``) or its JSON
    text; anything else is refused with the call that would work."""
    if isinstance(value, CompressionConfig):
        value.validate()
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"config {value[:60]!r} is not JSON; pass CompressionConfig(method=..., ...), a dict such as "
                f"{{'method': 'cp', 'rank': 0.5}}, or its JSON text (e.g. CompressionConfig.from_json_file(path))"
            ) from None
    if isinstance(value, dict):  # written now, so read as the current version: another method's option is an error
        return CompressionConfig.from_dict({"version": CONFIG_VERSION, **value})
    raise TypeError(
        f"config must be a CompressionConfig, a dict or a JSON string, got {type(value).__name__}; "
        "e.g. CompressionConfig(method='cp', rank=0.5) or CompressionConfig.from_dict({'method': 'cp', 'rank': 0.5})"
    )


# ---------------------------------------------------------------------- checks shared by the method configs
def check_rank(value: Any, where: str) -> None:
    """An int >= 1 (the rank itself) or a float in (0, 1] (that fraction of the dense layer's parameters)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be an int >= 1 or a float in (0, 1], got {value!r}")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"{where}={value} is not a rank: use an int >= 1, or a float in (0, 1] for a parameter ratio")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(
            f"{where}={value} is outside (0, 1]: a float is the fraction of the dense layer's parameters to keep "
            f"(e.g. 0.5); pass an int for an absolute rank"
        )


def one_of(default: Any, choices: tuple) -> Any:
    """A config field that takes one of ``choices`` (for a list field: each entry does): its ``metadata["choices"]``
    is what ``--help`` lists, the same tuple ``validate`` checks with ``check_choice``."""
    return field(default=default, metadata={"choices": choices})


def check_choice(value: Any, name: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {list(choices)}")


def check_int(value: Any, name: str, minimum: int, meaning: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{meaning}, got {value!r}")


def check_fraction(value: Any, name: str, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(f"{name}={value!r} must be a float in (0, 1]: {meaning}")


INITS = ("decompose", "random")


@dataclass
class RankedConfig(CompressionConfig):
    """Options of the low-rank methods (cp, svd): a rank for every target, per-module overrides, the init."""

    rank: int | float = 0.5
    ranks: dict[str, int | float] = field(default_factory=dict)
    init: str = one_of("decompose", INITS)

    def validate(self) -> None:
        super().validate()
        check_rank(self.rank, "rank")
        if not isinstance(self.ranks, dict):
            raise ValueError(f"ranks must be a dict {{module name: rank}}, got {type(self.ranks).__name__}")
        for name, value in self.ranks.items():
            check_rank(value, f"ranks[{name!r}]")
        check_choice(self.init, "init", INITS)

    def rank_for(self, module_name: str) -> int | float:
        """The rank asked for ``module_name``: the longest matching key of ``ranks``, else ``rank``."""
        matches = [key for key in self.ranks if module_name == key or module_name.endswith("." + key)]
        return self.ranks[max(matches, key=len)] if matches else self.rank
