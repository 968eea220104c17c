"""One table: model family -> supported classes and the attention modules whose projections get compressed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn


class UnsupportedModelError(ValueError):
    """The model's family has no default targets; lists the supported classes."""


@dataclass(frozen=True)
class ModelFamily:
    """A transformers model family: its ``config.model_type``, public classes and attention module classes."""

    model_type: str
    classes: tuple[str, ...]
    attention_classes: tuple[str, ...]


#: Projections compressed by default inside each attention module (encoder, decoder and cross attention).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")

FAMILIES: dict[str, ModelFamily] = {
    family.model_type: family
    for family in (
        ModelFamily("autoformer", ("AutoformerForPrediction", "AutoformerModel"), ("AutoformerAttention",)),
        ModelFamily(
            "informer",
            ("InformerForPrediction", "InformerModel"),
            ("InformerAttention", "InformerProbSparseAttention"),
        ),
        ModelFamily(
            "patchtst",
            (
                "PatchTSTForPrediction",
                "PatchTSTForRegression",
                "PatchTSTForClassification",
                "PatchTSTForPretraining",
                "PatchTSTModel",
            ),
            ("PatchTSTAttention",),
        ),
    )
}


def supported_classes() -> list[str]:
    return [name for family in FAMILIES.values() for name in family.classes]


def family_of(model: nn.Module) -> ModelFamily:
    """The model's family, or an error that names every supported class."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type={model_type!r}) has no default compression targets. "
            f"Supported: {', '.join(supported_classes())}. For another model, pass target_modules explicitly."
        )
    return FAMILIES[model_type]


def attention_projections(model: nn.Module, projections: tuple[str, ...] = ATTENTION_PROJECTIONS) -> list[str]:
    """Full names of the given projections inside every attention module of the model's family."""
    family = family_of(model)
    return [
        f"{name}.{projection}"
        for name, module in model.named_modules()
        if type(module).__name__ in family.attention_classes
        for projection in projections
        if isinstance(getattr(module, projection, None), nn.Linear)
    ]


def match_targets(model: nn.Module, target_modules: list[str] | str) -> list[str]:
    """Full module names matched by a list of names/suffixes or by one regex (full match)."""
    names = [name for name, _ in model.named_modules() if name]
    if isinstance(target_modules, str):
        pattern = re.compile(target_modules)
        return [name for name in names if pattern.fullmatch(name)]
    return [name for name in names if any(name == key or name.endswith("." + key) for key in target_modules)]


def parent_of(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rpartition(".")[0]) if "." in name else model
