"""Changing a Linear's form in the middle of ``SmartformerTrainer.train`` (the search over forms).

Within a kind the layer changes in place (a low-bit weight's width with ``set_bits``; low-rank or CP factors'
rank with ``set_rank`` and width with ``set_factor_bits``); across kinds the new layer is built by the ``mixed``
method's builder from the weight the old one computes with (the fp32 weight behind a low-bit one), so it starts near
what the layer computed, and its bias is the old bias parameter itself. The optimizer drops the old parameters and
takes the new ones into the old weight's group, each group kept in the model's parameter order (so a checkpoint's
optimizer state matches the optimizer a resumed run builds); ``compression_config`` records every Linear's form and
spec (``method="mixed"``). A trainable low-bit Linear's checkpoint holds its codes only (what the model loads as), so
a checkpoint inside the search also keeps the fp32 weights behind them (``LATENT_FILE``), which a resumed search
trains on exactly as the interrupted one would have. Linears shared across layers (``SearchConfig.shared``) follow
their source through every change: ``set_linear`` re-links them whenever the source's module is replaced.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..compress import check_not_compressed
from ..config import CompressionConfig
from ..core.export import mark_compressed
from ..methods.mixed.apply import build_form
from ..methods.mixed.config import shared_forms
from ..methods.mixed.shared import SharedLinear, check_source
from ..runtime.contract import CompressedLayer
from ..saving import save_extras
from .forms import Form, LinearSlot, mixed_forms

#: The fp32 weights and factors behind the trainable low-bit forms, kept beside a checkpoint's model weights.
LATENT_FILE = "search_latents.safetensors"


def prepare_for_forms(model: nn.Module, slots: list[LinearSlot], shared: dict[str, str] | None = None) -> None:
    """Record a dense ``model`` as a ``mixed`` model whose searched Linears are all still dense (so checkpoints
    saved while the search runs carry the structure and the code), each Linear of ``shared`` ({module: source})
    computing with its source's weights from now on (its own dropped). A source that is not a searched Linear, or of
    another shape, is refused before the model changes."""
    check_not_compressed(model)
    shared = shared or {}
    searched = {slot.name for slot in slots}
    modules = dict(model.named_modules())
    for name, source in shared.items():
        if source not in searched:
            raise ValueError(
                f"SearchConfig shared[{name!r}] = {source!r}: the source must be a Linear the search acts on "
                f"(one of {sorted(searched)[:4]}{' …' if len(searched) > 4 else ''})"
            )
        linear = modules.get(name)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"SearchConfig shared names {name!r}, which is not a Linear of {type(model).__name__}")
        check_source(modules[source], source, linear.in_features, linear.out_features, linear.bias is not None)
    config = CompressionConfig(method="mixed", target_modules=[slot.name for slot in slots] + list(shared))
    mark_compressed(model, {**config.to_dict(), "modules": {}}, save_hook=save_extras)
    for name, source in shared.items():
        linear = modules[name]
        model.set_submodule(
            name, SharedLinear(linear.in_features, linear.out_features, source, linear.bias is not None)
        )
    relink_shared(model)


def relink_shared(model: nn.Module) -> None:
    """Link every shared Linear of ``model`` to the module its source names now."""
    for module in model.modules():
        if isinstance(module, SharedLinear):
            module.bind(model)


def set_linear(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at ``name``, the Linears that share it following (a form measured or trained through every
    use)."""
    model.set_submodule(name, module)
    relink_shared(model)


def current_weight(module: nn.Module) -> torch.Tensor:
    """The ``(out, in)`` weight ``module`` computes with, before any rounding: what a new form starts from."""
    if isinstance(module, nn.Linear):
        return module.weight.detach()
    if getattr(module, "layer_type", "") == "lowbit" and not module.stored:
        return module.latent_weight().detach()
    if getattr(module, "layer_type", "") == "biprop":
        return module.dense_weight().detach()
    return module.weight.detach()


def _rotation(module: nn.Module) -> str:
    """A low-bit Linear's ``input_rotation`` (signs drawn from a seed: ``"randomized-hadamard"``)."""
    if module.rotation is None:
        return "none"
    return "hadamard" if module.rotation.seed is None else "randomized-hadamard"


def _same_kind(module: nn.Module, form: Form) -> bool:
    """Whether ``module`` changes to ``form`` in place (a low-bit weight only where its scales are set and its inputs
    rotated the same way)."""
    kind = getattr(module, "layer_type", "dense" if isinstance(module, nn.Linear) else "")
    if kind != form.kind or kind != "lowbit":
        return kind == form.kind
    return module.learned_scales == (form.scales == "learned") and _rotation(module) == form.rotation


def _in_place(module: nn.Module, form: Form, slot: LinearSlot) -> dict[nn.Parameter, nn.Parameter]:
    """Change ``module`` (of ``form``'s kind) to ``form`` where it is; returns {old: new} parameters."""
    if form.kind == "lowbit":
        return module.set_bits(form.bits, form.group)
    replaced = module.set_rank(form.rank, n_iter=slot.cp_iterations)
    module.set_factor_bits(form.bits, slot.factor_group_size)
    return replaced


def form_module(model: nn.Module, slot: LinearSlot, module: nn.Module, form: Form) -> nn.Module:
    """A new module of ``form`` for ``slot``, started from ``module``'s weight, sharing its bias parameter."""
    weight = current_weight(module)
    dense = nn.Linear(slot.in_features, slot.out_features, bias=slot.bias, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        dense.weight.copy_(weight)
        if slot.bias:
            dense.bias.copy_(module.bias)
    options = form.options(slot.factor_group_size, slot.cp_iterations, slot.bias_dtype, slot.rotation_block)
    new = dense if options is None else build_form(model, slot.name, dense, options)
    if slot.bias and getattr(new, "bias", None) is not None:
        new.bias = module.bias
    return new


def swap_parameters(optimizer: torch.optim.Optimizer, model: nn.Module, removed: list[nn.Parameter]) -> None:
    """Every ``removed`` parameter leaves ``optimizer`` (and its state), every parameter of ``model`` that no group
    holds joins the group the removed ones were in (the old weights'), and every group is sorted in the model's
    parameter order."""
    order = {id(p): index for index, p in enumerate(model.parameters())}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    anchors = {id(old) for old in removed}
    target = next(
        (group for group in optimizer.param_groups if any(id(p) in anchors for p in group["params"])),
        optimizer.param_groups[0],
    )
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in anchors]
    for old in removed:
        optimizer.state.pop(old, None)
    held -= anchors
    target["params"] += [p for p in model.parameters() if id(p) not in held and p.requires_grad]
    for group in optimizer.param_groups:
        group["params"].sort(key=lambda p: order.get(id(p), len(order)))


def change_forms(model: nn.Module, slots: dict[str, LinearSlot], forms: dict[str, Form]) -> list[nn.Parameter]:
    """Give each Linear of ``forms`` its new form; returns every parameter that left the model."""
    removed: list[nn.Parameter] = []
    for name, form in forms.items():
        module, slot = model.get_submodule(name), slots[name]
        if _same_kind(module, form) and form.kind == "dense":
            continue
        if _same_kind(module, form) and form.kind != "biprop":
            removed += [old for old, new in _in_place(module, form, slot).items() if old is not new]
            continue
        new = form_module(model, slot, module, form)
        kept = {id(p) for p in new.parameters()}
        removed += [p for p in module.parameters() if id(p) not in kept]
        set_linear(model, name, new)
    return removed


def record_forms(model: nn.Module, slots: list[LinearSlot], chosen: dict[str, Form]) -> None:
    """Re-record every searched Linear's form (``forms``) and spec (``modules``) in ``compression_config``, and
    every shared one's."""
    recorded = model.config.compression_config
    shared = {name: module for name, module in model.named_modules() if isinstance(module, SharedLinear)}
    recorded["forms"] = mixed_forms(slots, chosen) | shared_forms(
        {name: layer.source for name, layer in shared.items()}
    )
    layers = {slot.name: model.get_submodule(slot.name) for slot in slots} | shared
    recorded["modules"] = {name: layer.spec() for name, layer in layers.items() if isinstance(layer, CompressedLayer)}


def finish_forms(model: nn.Module, slots: list[LinearSlot], chosen: dict[str, Form]) -> None:
    """Once training ends: the biprop layers save their mask only (the scores were kept for resuming), so the
    saved model is every Linear packed as it is stored."""
    for slot in slots:
        layer = model.get_submodule(slot.name)
        if getattr(layer, "layer_type", "") == "biprop":
            layer.save_scores = False
    record_forms(model, slots, chosen)
    for options in model.config.compression_config["forms"].values():
        if options["method"] == "biprop":
            options["save_scores"] = False


def coded_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters of ``model`` that its ``state_dict`` holds as codes or in another dtype rather than as
    themselves: a low-bit Linear's fp32 weight and learned scales, its fp32 bias saved in fp16, a low-rank layer's
    fp32 factors under ``factor_bits``."""
    saved = model.state_dict(keep_vars=True)
    return {name: parameter for name, parameter in model.named_parameters() if saved.get(name) is not parameter}


def latent_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """The fp32 values behind every coded parameter, on the CPU: the codes alone would resume training from rounded
    weights, not where it stopped."""
    return {name: parameter.detach().cpu().contiguous() for name, parameter in coded_parameters(model).items()}


def set_latent_values(model: nn.Module, latents: dict[str, torch.Tensor]) -> None:
    """Give the coded parameters the values ``latent_values`` took (after a checkpoint's codes loaded)."""
    with torch.no_grad():
        for name, latent in latents.items():
            model.get_parameter(name).copy_(latent)


def save_latents(model: nn.Module, folder: str) -> None:
    """Write ``latent_values`` into ``folder`` (a checkpoint)."""
    latents = latent_values(model)
    if latents:
        save_file(latents, os.path.join(folder, LATENT_FILE))


def load_latents(model: nn.Module, folder: str) -> None:
    """Give the coded parameters the fp32 values ``save_latents`` kept."""
    path = os.path.join(folder, LATENT_FILE)
    if os.path.exists(path):
        set_latent_values(model, load_file(path))
