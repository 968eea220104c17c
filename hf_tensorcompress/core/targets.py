"""One table: model family -> supported classes, the attention projections compressed by default, and whether the
token embedding is a default target (the embedding methods')."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn


class UnsupportedModelError(ValueError):
    """The model's family has no default targets; lists the supported classes."""


@dataclass(frozen=True)
class ModelFamily:
    """A transformers model family: its ``config.model_type``, public classes, attention module classes, the
    projections compressed by default inside them, and whether its token embedding is a default target.

    ``projections`` names the query/key/value projections; a family that fuses them (GPT-2's ``c_attn``, a
    ``Conv1D``; Phi-3's ``qkv_proj``; GPT-NeoX's ``query_key_value``) names the fused one, which is compressed as
    one matrix: its input side is still the ``heads × head_dim`` hidden vector that CP folds, and splitting it
    would cost three sets of factors for the same input. ``output_projection`` is the attention output projection
    (a default target too for methods that take it), ``None`` where it lives outside the attention module (BERT).
    """

    model_type: str
    classes: tuple[str, ...]
    attention_classes: tuple[str, ...]
    projections: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    output_projection: str | None = "out_proj"
    token_embedding: bool = False


def _lm(model_type: str, prefix: str, projections=("q_proj", "k_proj", "v_proj"), output="o_proj") -> ModelFamily:
    """A causal-LM family: ``<Prefix>ForCausalLM`` and ``<Prefix>Model``, attention ``<Prefix>Attention``."""
    return ModelFamily(
        model_type, (f"{prefix}ForCausalLM", f"{prefix}Model"), (f"{prefix}Attention",), projections, output, True
    )


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
        ModelFamily("gpt2", ("GPT2LMHeadModel", "GPT2Model"), ("GPT2Attention",), ("c_attn",), "c_proj", True),
        ModelFamily("opt", ("OPTForCausalLM", "OPTModel"), ("OPTAttention",), token_embedding=True),
        _lm("llama", "Llama"),
        _lm("qwen2", "Qwen2"),
        _lm("qwen3", "Qwen3"),
        _lm("mistral", "Mistral"),
        _lm("gemma", "Gemma"),
        _lm("gemma2", "Gemma2"),
        ModelFamily(
            "gemma3_text",
            ("Gemma3ForCausalLM", "Gemma3TextModel"),
            ("Gemma3Attention",),
            output_projection="o_proj",
            token_embedding=True,
        ),
        _lm("phi", "Phi", output="dense"),
        _lm("phi3", "Phi3", ("qkv_proj",)),
        _lm("gpt_neox", "GPTNeoX", ("query_key_value",), "dense"),
        ModelFamily(
            "bert",
            ("BertForMaskedLM", "BertModel", "BertForSequenceClassification"),
            ("BertSelfAttention",),
            ("query", "key", "value"),
            None,
            True,
        ),
        ModelFamily("vit", ("ViTModel", "ViTForImageClassification"), ("ViTAttention",), output_projection="o_proj"),
        ModelFamily(
            "whisper",
            ("WhisperForConditionalGeneration", "WhisperModel"),
            ("WhisperAttention",),
        ),
    )
}


def projection_types() -> tuple[type[nn.Module], ...]:
    """Module types the attention methods replace: ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2)."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


@dataclass(frozen=True)
class DenseProjection:
    """A projection read the ``nn.Linear`` way, whichever module holds it: ``weight`` is ``(out, in)``."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]


def dense_projection(module: nn.Module) -> DenseProjection:
    """``nn.Linear`` as it is; a ``Conv1D`` (``y = x W + b`` with ``W`` stored ``(in, out)``) transposed."""
    weight = module.weight if isinstance(module, nn.Linear) else module.weight.T
    return DenseProjection(weight.detach(), None if module.bias is None else module.bias.detach())


def families_table() -> str:
    """The docs' table of supported families and their default targets, made from ``FAMILIES`` when the site builds."""
    rows = ["| family (`model_type`) | classes | attention projections | token embedding |", "|---|---|---|---|"]
    for family in FAMILIES.values():
        targets = ", ".join(f"`{name}`" for name in family.projections)
        if family.output_projection:
            targets += f" (+ output `{family.output_projection}`)"
        classes = ", ".join(f"`{name}`" for name in family.classes)
        rows.append(f"| {family.model_type} | {classes} | {targets} | {'yes' if family.token_embedding else '—'} |")
    return "\n".join(rows)


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


def attention_projections(model: nn.Module, with_output: bool = False) -> list[str]:
    """Full names of the q/k/v projections (and the output projection if asked) inside every attention module
    of the model's family: encoder, decoder and cross attention."""
    family = family_of(model)
    projections = family.projections + ((family.output_projection,) if with_output and family.output_projection else ())
    kinds = projection_types()
    return [
        f"{name}.{projection}"
        for name, module in model.named_modules()
        if type(module).__name__ in family.attention_classes
        for projection in projections
        if isinstance(getattr(module, projection, None), kinds)
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
