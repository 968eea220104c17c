"""Options of ``method="mixed"``: each target Linear in a form of its own (what the byte search chooses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...config import CompressionConfig
from ...core.registry import config_class

#: The methods a Linear's form may be: the full weight in a few bits, low-rank factors, CP factors, a Biprop mask.
FORM_METHODS = ("lowbit", "svd", "cp", "biprop")
#: The form of a Linear that reuses another module's weights (``{"method": "shared", "source": <full module name>}``).
SHARED = "shared"


def is_shared(form: Any) -> bool:
    return isinstance(form, dict) and form.get("method") == SHARED


def shared_forms(shared: dict[str, str] | None) -> dict[str, dict]:
    """The forms that make each Linear of ``shared`` ({module: source}) compute with its source's weights."""
    return {name: {"method": SHARED, "source": source} for name, source in (shared or {}).items()}


def check_shared(form: dict, where: str) -> None:
    """A shared form names its source, by full module name, and nothing else."""
    if set(form) != {"method", "source"} or not isinstance(form["source"], str) or not form["source"]:
        raise ValueError(
            f"{where} = {form!r}: a shared form is {{'method': 'shared', 'source': <the full name of the module whose "
            "weights it reuses, e.g. 'model.encoder.layers.0.ff.0'>}} and nothing else"
        )


#: Options a form may not set: they belong to the whole model, not to one Linear.
MODEL_OPTIONS = ("target_modules", "ranks", "attention", "attention_keep_ratio", "attention_length")


def form_config(form: Any, key: str = "") -> CompressionConfig:
    """The config of one Linear's form (``{"method": "svd", "rank": 8, "factor_bits": 4}``), validated by that
    method's own config class; a ``ValueError`` names the form's key and what is wrong."""
    where = f"forms[{key!r}]" if key else "a form"
    if not isinstance(form, dict) or form.get("method") not in FORM_METHODS:
        raise ValueError(
            f"{where} = {form!r}: each form is a dict whose 'method' is one of {list(FORM_METHODS)}, with that "
            "method's options, e.g. {'method': 'lowbit', 'weight_bits': 2, 'weight_group_size': 64}, or "
            "{'method': 'shared', 'source': <module name>} to reuse another Linear's weights"
        )
    refused = sorted(set(form) & set(MODEL_OPTIONS))
    if refused:
        raise ValueError(f"{where} sets {refused}: a form configures one Linear; leave them out")
    options = {name: value for name, value in form.items() if name != "method"}
    try:
        return config_class(form["method"])(**options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


@dataclass
class MixedConfig(CompressionConfig):
    """Each target Linear becomes the form ``forms`` gives it: ``{module name or suffix: form}``, the longest
    matching key winning, a form being ``{"method": <lowbit|svd|cp|biprop>, **that method's options}``.

    Args:
        forms: the forms, e.g. ``{"q_proj": {"method": "svd", "rank": 8, "factor_bits": 4}, "fc1": {"method":
            "lowbit", "weight_bits": 2, "weight_group_size": 64}}``. The targets (``target_modules``) default to the keys.
            ``{"method": "shared", "source": "model.encoder.layers.0.ff.0"}`` makes a Linear reuse the weights of
            the Linear of that full name (of its shape; in whatever form that one takes): stored once, trained by
            both uses (cross-layer sharing: two layers' computation at one layer's bytes).

    What ``SmartformerTrainer``'s byte search over forms ends with (``SearchConfig(forms=...)``): its model records
    the chosen form of every Linear here, so the same allocation can be applied to another model of the architecture.
    """

    method: str = "mixed"
    forms: dict[str, dict] = field(default_factory=dict)

    method_name: ClassVar[str] = "mixed"

    def __post_init__(self) -> None:
        if self.target_modules is None and isinstance(self.forms, dict) and self.forms:
            self.target_modules = list(self.forms)  # the modules the forms name: their keys as names or suffixes
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.forms, dict):
            raise ValueError(f"forms must be a dict {{module name or suffix: form}}, got {type(self.forms).__name__}")
        for key, form in self.forms.items():
            if is_shared(form):
                check_shared(form, f"forms[{key!r}]")
            else:
                form_config(form, key)

    def form_for(self, module_name: str) -> dict | None:
        """The form of ``module_name``: the longest key that names it or ends it (``None``: no key does)."""
        keys = [key for key in self.forms if module_name == key or module_name.endswith("." + key)]
        return self.forms[max(keys, key=len)] if keys else None
