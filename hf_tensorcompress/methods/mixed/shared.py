"""A Linear that reuses another Linear of the same model: cross-layer weight sharing (as ALBERT shares its layers'
weights), the form ``{"method": "shared", "source": <module name>}`` of ``method="mixed"``.

The layer owns no tensors: it computes with the module ``source`` names (a compressed layer or a dense Linear of the
same shape), so the weights are stored, loaded and held in memory once and trained by both uses. ``bind`` links it to
that module once every layer of the model is installed (a checkpoint records the name, not the tensors).

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.contract import CompressedLinear


def check_source(source: nn.Module, name: str, in_features: int, out_features: int, bias: bool) -> None:
    """``source`` (module ``name``) can stand in for a Linear of these sizes: same shape, a bias where it has one, not
    itself a shared layer (a chain would store nothing at all)."""
    if isinstance(source, SharedLinear):
        raise ValueError(f"{name!r} is itself shared from {source.source!r}; share from {source.source!r} directly")
    sizes = (getattr(source, "in_features", None), getattr(source, "out_features", None))
    if sizes != (in_features, out_features):
        raise ValueError(
            f"{name!r} is a {type(source).__name__} of (in, out) {sizes}; a Linear of ({in_features}, {out_features}) "
            "can only share a module of its own shape"
        )
    has_bias = getattr(source, "bias", None) is not None
    if has_bias != bias:
        raise ValueError(
            f"{name!r} {'has' if has_bias else 'has no'} bias, the Linear sharing it {'has' if bias else 'has none'}; "
            "share a module with the same bias"
        )


class SharedLinear(CompressedLinear):
    """``y = source(x)``: the Linear of module ``source`` (its full name in the model), reused here."""

    layer_type = "shared"

    def __init__(self, in_features: int, out_features: int, source: str, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features, self.source, self.has_bias = in_features, out_features, source, bias
        object.__setattr__(self, "source_layer", None)  # a reference, not a submodule: no duplicate state

    @property
    def bias(self) -> torch.Tensor | None:
        """The source's bias (None before ``bind``)."""
        return None if self.source_layer is None else self.source_layer.bias

    def dense_parameters(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.has_bias else 0)

    def spec(self) -> dict:
        return {**super().spec(), "bias": self.has_bias, "source": self.source}

    @classmethod
    def from_spec(cls, spec: dict) -> SharedLinear:
        if not isinstance(spec.get("source"), str) or not spec["source"]:
            raise ValueError(
                f"a shared layer's spec names the module it shares as 'source', got {spec.get('source')!r}"
            )
        return cls(spec["in_features"], spec["out_features"], spec["source"], bool(spec.get("bias", True)))

    def reset_parameters(self) -> None:
        """Nothing of its own to initialise."""

    def bind(self, model: nn.Module) -> None:
        """Link to the module ``source`` names, now that every layer of ``model`` is installed."""
        source = model.get_submodule(self.source)
        if source is self:
            raise ValueError(f"{self.source!r} shares itself; name another Linear of its shape as its source")
        check_source(source, self.source, self.in_features, self.out_features, self.has_bias)
        object.__setattr__(self, "source_layer", source)

    def _bound(self) -> nn.Module:
        if self.source_layer is None:
            raise RuntimeError(
                f"this layer shares {self.source!r} but is not linked to it; install it with apply_compression or "
                "load the model with from_pretrained (either calls bind(model))"
            )
        return self.source_layer

    def stored_parameters(self) -> int:
        return 0

    def storage_bits(self) -> int:
        return 0

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        source = self._bound()
        if hasattr(source, "multiply_adds"):
            count, path = source.multiply_adds(tokens, cached)
            return count, f"shared {path}"
        return tokens * self.in_features * self.out_features, "shared dense"

    def dense_weight(self) -> torch.Tensor:
        source = self._bound()
        return source.dense_weight() if hasattr(source, "dense_weight") else source.weight

    def dense_bias(self) -> torch.Tensor | None:
        source = self._bound()
        return source.dense_bias() if hasattr(source, "dense_bias") else source.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._bound()(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, shares {self.source}"
