"""``method="mixed"``: every target Linear built by the method its form names (lowbit, svd, cp, biprop)."""

from __future__ import annotations

from torch import nn

from ...core.registry import Method, method_for
from ...core.targets import projection_types
from ..biprop.layer import BipropLinear
from ..cp.layer import CPLinear
from ..lowbit.layer import LowBitLinear
from ..svd.layer import LowRankLinear
from .config import MixedConfig, form_config, is_shared
from .shared import SharedLinear, check_source


def no_default_targets(model: nn.Module) -> list[str]:
    raise ValueError(
        "method='mixed' compresses the Linears its forms name (the keys are the targets); pass forms={module name "
        "or suffix: {'method': ..., options}}"
    )


def build_form(model: nn.Module, name: str, linear: nn.Module, form: dict) -> nn.Module:
    """Module ``name`` (``linear``, dense) as the layer of ``form``, built by that method from the dense weights."""
    options = form_config(form, name)
    return method_for(options).build(model, name, linear, options, None)


def build_shared(model: nn.Module, name: str, linear: nn.Module, config: MixedConfig, source: str) -> SharedLinear:
    """Module ``name`` as a reuse of module ``source``, checked against the model as it will be: the source exists,
    has the Linear's shape and bias, and is not itself shared."""
    if source == name:
        raise ValueError(f"forms: {name} shares itself; name another Linear of its shape as 'source'")
    try:
        found = model.get_submodule(source)
    except AttributeError:
        raise ValueError(f"forms: {name} shares {source!r}, which this model has no module named") from None
    if is_shared(config.form_for(source)):
        raise ValueError(f"forms: {name} shares {source!r}, which is itself shared; share its source directly")
    bias = getattr(linear, "bias", None) is not None
    check_source(found, source, linear.in_features, linear.out_features, bias)
    return SharedLinear(linear.in_features, linear.out_features, source, bias)


def build(model: nn.Module, name: str, linear: nn.Module, config: MixedConfig, calibration: None = None) -> nn.Module:
    form = config.form_for(name)
    if form is None:
        raise ValueError(f"{name} is a target of method 'mixed', but no key of forms names it; add one")
    if is_shared(form):
        return build_shared(model, name, linear, config, form["source"])
    return build_form(model, name, linear, form)


def reads_weights(config: MixedConfig) -> bool:
    return any(
        method_for(form_config(form)).reads_weights(form_config(form))
        for form in config.forms.values()
        if not is_shared(form)
    )


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "mixed",
    MixedConfig,
    no_default_targets,
    build,
    accepts=projection_types(),
    reads_weights=reads_weights,
    layers=(LowBitLinear, LowRankLinear, CPLinear, BipropLinear, SharedLinear),
)
