"""The byte search over forms: for every targeted Linear, which form it takes.

A form is what one ``nn.Linear`` can become: dense (fp32, unchanged); ``lowbit`` (the full weight in a few bits);
``svd`` (rank ``r``, factors in a few bits or fp32); ``cp`` (rank ``r`` CP factors, for the attention's q/k/v
projections); ``biprop`` (a mask over frozen ±α signs at keep ratio ``k``, 1 bit a weight). A ``LinearSlot`` is one
searched Linear with its actions (the forms the user allows, at every width, rank and keep ratio) and what each
costs in bytes as stored: the layer a checkpoint would rebuild from that form's spec, built on the meta device and
asked its ``storage_bits``, so the budget counts exactly what ``save_pretrained`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.targets import attention_projections, match_targets, projection_types
from ..methods.biprop.layer import BipropLinear
from ..methods.cp.apply import heads_of
from ..methods.cp.layer import CPLinear
from ..methods.lowbit.apply import all_linear
from ..methods.lowbit.layer import LowBitLinear
from ..methods.svd.layer import LowRankLinear
from ..runtime.marker import FACTOR_WIDTHS, INPUT_ROTATIONS
from .config import GREEDY_START
from .space import Width, candidate_ranks

#: The layer class of each form (what a checkpoint rebuilds it as).
LAYERS = {cls.layer_type: cls for cls in (LowBitLinear, LowRankLinear, CPLinear, BipropLinear)}

#: The forms a Linear can take, in the order the search lists them.
FORM_KINDS = ("dense", "lowbit", "svd", "cp", "biprop")
#: The token fields of a Linear in the state encoder (``LinearSlot.describe``).
SLOT_FIELDS = ("form", "pos", "in", "out", "rank", "bits", "keep")


@dataclass(frozen=True)
class Form:
    """One form of one Linear: ``kind`` (``FORM_KINDS``), the width of its weight or factors (``bits``, ``None``:
    fp32), its rank (``svd``, ``cp``), its keep ratio (``biprop``), its weight's group size, how its group scales
    are set (``lowbit``: ``scales`` ``"rounded"`` from the weights at every step, or ``"learned"``) and how its inputs
    are rotated first (``lowbit``: ``rotation``, ``LowBitConfig.input_rotation``)."""

    kind: str
    bits: Width = None
    rank: int | None = None
    keep: float | None = None
    group: int | None = None
    scales: str = "rounded"
    rotation: str = "none"

    def options(
        self, factor_group_size: int | None, cp_iterations: int, bias_dtype: str = "model", rotation_block: int = 128
    ) -> dict | None:
        """The form as ``method="mixed"`` records it (``None``: dense, no layer); ``bias_dtype`` and
        ``rotation_block``: the ``lowbit`` form's (``LowBitConfig``)."""
        if self.kind == "lowbit":
            learned = {"weight_scales": "learned"} if self.scales == "learned" else {}
            half = {"bias_dtype": bias_dtype} if bias_dtype != "model" else {}
            rotated = (
                {} if self.rotation == "none" else {"input_rotation": self.rotation, "rotation_block": rotation_block}
            )
            weight = {"weight_bits": self.bits, "weight_group_size": self.group}
            return {"method": "lowbit", **weight, **learned, **half, **rotated}
        if self.kind in ("svd", "cp"):
            factors = {"factor_bits": self.bits, "factor_group_size": factor_group_size}
            extra = {"cp_iterations": cp_iterations} if self.kind == "cp" else {}
            return {"method": self.kind, "rank": self.rank, **factors, **extra}
        if self.kind == "biprop":  # scores saved while searching (a resumed run trains on); dropped at the end
            return {"method": "biprop", "keep_ratio": self.keep, "init": "dense", "bias": True, "save_scores": True}
        return None

    def label(self) -> str:
        """Short text for logs and tables: ``dense``, ``lowbit:2/g64``, ``lowbit:ternary/g128/learned/hadamard``,
        ``svd:r8:4``, ``cp:r6:ternary``, ``biprop:0.5``."""
        if self.kind == "lowbit":
            learned = "/learned" if self.scales == "learned" else ""
            rotated = "" if self.rotation == "none" else f"/{self.rotation}"
            return f"lowbit:{self.bits}/" + ("row" if self.group is None else f"g{self.group}") + learned + rotated
        if self.kind in ("svd", "cp"):
            return f"{self.kind}:r{self.rank}:{self.bits}"
        return f"biprop:{self.keep}" if self.kind == "biprop" else "dense"

    def dump(self) -> list:
        return [self.kind, self.bits, self.rank, self.keep, self.group, self.scales, self.rotation]

    @classmethod
    def from_label(cls, text: str) -> Form:
        """The form a ``label`` names (``dense``, ``lowbit:2/row``, ``lowbit:4/g32``, ``lowbit:2/g32/learned``,
        ``lowbit:ternary/g128/hadamard``, ``svd:r8:4``, ``cp:r6:None``, ``biprop:0.5``); a ``ValueError`` says what a
        label looks like."""
        kind, _, rest = text.partition(":")
        try:
            if text == "dense":
                return cls("dense")
            if kind == "lowbit":
                bits, group, *extra = rest.split("/")
                scales = extra.pop(0) if extra[:1] == ["learned"] else "rounded"
                rotation = extra.pop(0) if extra[:1] and extra[0] in INPUT_ROTATIONS[1:] else "none"
                width = _width(bits)
                if width is not None and (group == "row" or group.startswith("g")) and not extra:
                    size = None if group == "row" else int(group.removeprefix("g"))
                    return cls("lowbit", width, group=size, scales=scales, rotation=rotation)
            if kind in ("svd", "cp"):
                rank, _, bits = rest.partition(":")
                if rank.startswith("r"):
                    return cls(kind, _width(bits), rank=int(rank.removeprefix("r")))
            if kind == "biprop":
                return cls("biprop", keep=float(rest))
        except ValueError:
            pass
        raise ValueError(
            f"form {text!r}: one of dense, lowbit:<bits>/<g<group>|row>[/learned][/hadamard|/randomized-hadamard], "
            "svd:r<rank>:<bits>, cp:r<rank>:<bits>, "
            "biprop:<keep> (bits: 16, 8, 4, 3, 2, ternary, 1, or None for fp32 factors), e.g. lowbit:2/row"
        )

    @classmethod
    def parse(cls, value: list) -> Form:
        return cls(*value)


def _width(text: str) -> Width:
    """A width as a label writes it: bits, ``ternary`` or ``None`` (fp32)."""
    if text in ("None", "ternary"):
        return None if text == "None" else text
    if text.isdigit() and int(text) in FACTOR_WIDTHS:
        return int(text)
    raise ValueError(f"width {text!r}")


@dataclass(frozen=True)
class LinearSlot:
    """One searched Linear: its sizes, its actions (``Form``s) and their bytes as stored (``costs``)."""

    name: str
    position: int
    in_features: int
    out_features: int
    bias: bool
    heads: int
    actions: tuple[Form, ...]
    costs: dict[Form, float] = field(compare=False, repr=False)
    factor_group_size: int | None = None
    cp_iterations: int = 12
    bias_dtype: str = "model"
    rotation_block: int = 128

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def dense_params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)

    @property
    def dense_bytes(self) -> int:
        return 4 * self.dense_params

    def bytes_at(self, form: Form) -> float:
        """Bytes of this Linear in ``form`` as stored (measured once per form)."""
        if form not in self.costs:
            self.costs[form] = form_bytes(self, form)
        return self.costs[form]

    def cost(self, form: Form, in_bytes: bool = True) -> float:
        """What the budget counts of ``form``: its bytes as stored (the search over forms is a byte search)."""
        return self.bytes_at(form)

    def describe(self, form: Form) -> list[str]:
        values = (form.kind, self.position, self.in_features, self.out_features, form.rank, form.bits, form.keep)
        return [f"{name}:{value}" for name, value in zip(SLOT_FIELDS, values)]

    @staticmethod
    def dump(form: Form) -> list:
        return form.dump()

    @staticmethod
    def parse(value: list) -> Form:
        return Form.parse(value)

    def rank_of(self, form: Form) -> int:
        """The rank of the weight the form computes with (full rank for every form but svd and cp)."""
        return form.rank if form.rank is not None else min(self.in_features, self.out_features)

    @staticmethod
    def bits_of(form: Form) -> Width:
        return form.bits


def form_spec(slot: LinearSlot, form: Form) -> dict | None:
    """The spec a checkpoint records for ``slot`` in ``form`` (``None``: dense)."""
    sizes = {"in_features": slot.in_features, "out_features": slot.out_features, "bias": slot.bias}
    factors = {} if form.bits is None else {"factor_bits": form.bits, "factor_group_size": slot.factor_group_size}
    if form.kind == "lowbit":
        half = {"bias_dtype": "float16"} if slot.bias and slot.bias_dtype == "float16" else {}
        rotated = {} if form.rotation == "none" else {"rotation_block": slot.rotation_block}
        return {"type": "lowbit", **sizes, "bits": form.bits, "group_size": form.group, **half, **rotated}
    if form.kind == "svd":
        return {"type": "svd", **sizes, "rank": form.rank, **factors}
    if form.kind == "cp":
        return {"type": "cp", **sizes, "num_heads": slot.heads, "rank": form.rank, **factors}
    if form.kind == "biprop":
        return {
            "type": "biprop",
            "in_features": slot.in_features,
            "out_features": slot.out_features,
            "keep_ratio": form.keep,
            "weight_init": "kaiming_normal",
            "sign_seed": 0,
            "save_scores": False,
        } | ({"bias": True} if slot.bias else {})
    return None


def form_bytes(slot: LinearSlot, form: Form) -> float:
    """Bytes of ``slot`` in ``form`` as stored: the layer its spec rebuilds, on the meta device, counted by its own
    ``storage_bits``; dense is fp32 weights and bias."""
    spec = form_spec(slot, form)
    if spec is None:
        return float(slot.dense_bytes)
    with torch.device("meta"):
        return LAYERS[spec["type"]].from_spec(spec).storage_bits() / 8


def mixed_forms(slots: list[LinearSlot], allocation: dict[str, Form]) -> dict[str, dict]:
    """``method="mixed"``'s ``forms`` for ``allocation`` ({Linear: form}): every Linear not left dense, with the
    options that build its form."""
    forms = {
        slot.name: allocation[slot.name].options(
            slot.factor_group_size, slot.cp_iterations, slot.bias_dtype, slot.rotation_block
        )
        for slot in slots
    }
    return {name: options for name, options in forms.items() if options is not None}


def slot_actions(
    in_features: int,
    out_features: int,
    heads: int,
    attention: bool,
    kinds: tuple[str, ...],
    widths: tuple[Width, ...],
    keep_ratios: tuple[float, ...],
    group_sizes: tuple[int | None, ...],
    max_candidates: int,
    weight_scales: tuple[str, ...] = ("rounded",),
    input_rotations: tuple[str, ...] = ("none",),
    rotation_block: int = 128,
) -> tuple[Form, ...]:
    """Every form of one Linear among ``kinds``: lowbit at every width (not fp32), weight group size, way of
    setting its scales and input rotation (the rotations only where ``rotation_block`` divides the inputs; a Linear
    it does not takes its low-bit forms unrotated), svd and cp (cp only for attention projections) at every candidate
    rank (parameter ratios 1/n … 1) and width, biprop at every keep ratio, and dense."""
    actions: list[Form] = []
    dense_weights = in_features * out_features
    for kind in kinds:
        if kind == "dense":
            actions.append(Form("dense"))
        elif kind == "lowbit":
            rotations = ("none",) if in_features % rotation_block else input_rotations
            actions += [
                Form("lowbit", bits, group=g, scales=scales, rotation=rotation)
                for bits in widths
                if bits is not None
                for g in group_sizes
                for scales in weight_scales
                for rotation in rotations
            ]
        elif kind == "svd":
            ranks = candidate_ranks(dense_weights, in_features + out_features, max_candidates)
            limit = min(in_features, out_features)
            actions += [Form("svd", bits, rank=r) for bits in widths for r in ranks if r <= limit]
        elif kind == "cp" and attention:
            head_dim = in_features // heads
            ranks = candidate_ranks(dense_weights, heads + head_dim + out_features, max_candidates)
            limit = min(heads * head_dim, heads * out_features, head_dim * out_features)
            actions += [Form("cp", bits, rank=r) for bits in widths for r in ranks if r <= limit]
        elif kind == "biprop":
            actions += [Form("biprop", keep=keep) for keep in keep_ratios]
    return tuple(actions)


def searched_linears(model: nn.Module, target_modules: list[str] | str | None) -> list[str]:
    """The Linears the search over forms acts on: ``target_modules`` (names, suffixes or a regex) or every Linear
    but a language model's output head."""
    if target_modules is None:
        return all_linear(model)
    kinds = projection_types()
    names = [name for name in match_targets(model, target_modules) if isinstance(model.get_submodule(name), kinds)]
    if not names:
        raise ValueError(f"SearchConfig target_modules={target_modules!r} names no Linear of {type(model).__name__}")
    return names


def linear_slots(model: nn.Module, config) -> list[LinearSlot]:
    """One slot per searched Linear of a dense ``model``, with the actions ``config`` (a ``SearchConfig`` with
    ``forms``) allows and their bytes; the Linears of ``config.shared`` are not searched (they take their source's)."""
    try:
        attention = set(attention_projections(model))
    except ValueError:  # a family without known attention modules: no cp form
        attention = set()
    slots = []
    shared = config.shared or {}
    names = [name for name in searched_linears(model, config.target_modules) if name not in shared]
    for position, name in enumerate(names):
        module = model.get_submodule(name)
        in_features, out_features = module.weight.shape[1], module.weight.shape[0]
        if not isinstance(module, nn.Linear):  # GPT-2's Conv1D stores (in, out)
            in_features, out_features = out_features, in_features
        heads = heads_of(model, name, in_features)
        actions = slot_actions(
            in_features,
            out_features,
            heads,
            name in attention,
            config.forms,
            config.widths,
            config.keep_ratios,
            config.weight_group_sizes,
            config.max_candidates,
            config.weight_scales,
            config.input_rotations,
            config.rotation_block,
        )
        slot = LinearSlot(
            name,
            position,
            in_features,
            out_features,
            module.bias is not None,
            heads,
            actions,
            {},
            config.factor_group_size,
            config.als_iterations,
            config.bias_dtype,
            config.rotation_block,
        )
        slot.costs.update({form: form_bytes(slot, form) for form in actions})
        slots.append(slot)
    return slots


def start_form(slots: list[LinearSlot], label: str) -> Form:
    """The form every searched Linear starts in (``SearchConfig.start``): dense, the model as given, or a form the
    search may choose for every one of them (a Linear still undecided when training ends keeps its start form).
    ``"greedy"`` starts dense: the greedy allocation is measured on the model once it has trained a stage."""
    form = Form.from_label("dense" if label == GREEDY_START else label)
    common = set.intersection(*(set(slot.actions) for slot in slots)) if slots else set()
    if form.kind == "dense" or form in common:
        return form
    allowed = ", ".join(sorted(f.label() for f in common if f.kind != "dense")) or "none"
    raise ValueError(
        f"SearchConfig(start={label!r}) is not a form the search may choose for every searched Linear (its forms, "
        "factor_widths, weight_group_sizes and keep_ratios; svd and cp ranks differ per Linear), and a Linear left "
        f"undecided keeps its start form: start from 'dense' or one of: {allowed}"
    )


def pareto_front(slot: LinearSlot, losses: dict[Form, float]) -> list[int]:
    """Indices of ``slot.actions`` that no other action beats in both bytes and ``losses`` (measured loss increase):
    cheapest first, each kept where it loses less than every cheaper one."""
    order = sorted(range(len(slot.actions)), key=lambda i: (slot.bytes_at(slot.actions[i]), losses[slot.actions[i]]))
    front, best = [], float("inf")
    for index in order:
        if losses[slot.actions[index]] < best:
            front.append(index)
            best = losses[slot.actions[index]]
    return sorted(front)
