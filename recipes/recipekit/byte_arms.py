"""The byte search's arms: ``smartformer-bytes`` (the RL search over the form of every Linear under a byte budget:
dense, full-rank low-bit, low-rank or CP factors at a width, a Biprop mask) and, at the bytes each seed's search
ended with, the allocations a user could make without RL over the same forms: one form everywhere, random ones, and a
greedy HAQ-style allocation by measured sensitivity; ``lowbit-<bits>-g<group>`` (the library's full-rank low-bit
method on every Linear); ``rows-<bits>-<fraction>`` (two widths inside every Linear); ``ends-<bits>-<bits>`` (the
first and last Linear wider than the ternary rest); and int4/int2 weight QAT of every Linear (the quantization a user
would train instead)."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable

import torch
from torch.nn.utils import parametrize

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.methods.lowbit.learned_scales import initial_scales, learned_values
from hf_tensorcompress.methods.mixed.config import shared_forms
from hf_tensorcompress.runtime.factor_storage import fp16_rounded, rounded, stored_form
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS
from hf_tensorcompress.search.allocators import greedy_allocation, random_allocation, uniform_forms
from hf_tensorcompress.search.forms import Form, LinearSlot, mixed_forms

from .arm_names import ENDS_ARM, LOWBIT_ARM, ROWS_ARM
from .costs import scope_names

#: Widths the byte search and its baselines choose among by default: every width ``factor_bits`` / ``lowbit`` stores
#: but 1 bit, which ``--factor-widths ... 1`` adds (offered at 1/32 it left the search worse on two of three data sets).
BYTE_WIDTHS = tuple(width for width in FACTOR_WIDTHS if width != 1)
#: Group size of the int-N QAT weights (as the PTQ baselines' int4/int2).
GROUP = 32
#: The uniform allocations: one form everywhere, at the most bytes that fit the search's.
UNIFORM_KINDS = ("lowbit", "svd", "biprop")
#: Arms derived from each seed's byte search: its final bytes, allocated other ways, and its own final forms trained
#: from the first step (the search trains them only from the step it chose each).
BYTE_DERIVED = (
    *(f"uniform-{kind}-bytes" for kind in UNIFORM_KINDS),
    "random-bytes",
    "greedy-bytes",
    "searched-bytes",
)
#: Weight QAT of every Linear in int-N groups of 32 (straight-through), deployed as those codes.
INT_QAT_ARMS = ("qat-int4-all", "qat-int2-all")
#: Input columns per learned scale of the ``rows-`` arms (as ``lowbit-ternary-g128-learned``).
ROWS_GROUP = 128
#: A Linear of a numbered layer: (the path up to the index, the index, the rest of the name).
LAYER_INDEX = re.compile(r"(.*\.layers\.)(\d+)(\..+)")

Allocation = dict[str, Form]  # Linear name -> its form


def lowbit_arm(name: str) -> tuple[int | str, int, str, str, str] | None:
    """(bits, group size, weight scales, bias dtype, input rotation) of a
    ``lowbit-<bits>-g<group>[-learned][-fp16-bias][-hadamard]`` arm name, or None."""
    match = LOWBIT_ARM.fullmatch(name)
    if match is None:
        return None
    bits = int(match.group(1)) if match.group(1).isdigit() else match.group(1)
    scales = "learned" if match.group(3) else "rounded"
    rotation = "hadamard" if match.group(5) else "none"
    return bits, int(match.group(2)), scales, "float16" if match.group(4) else "model", rotation


def dense_fraction(name: str) -> float | None:
    """The share of the steps a ``lowbit-…-after-dense-<fraction>`` arm trains dense before it is quantized, or
    None (quantization-aware from the first step)."""
    match = LOWBIT_ARM.fullmatch(name)
    return None if match is None or match.group(6) is None else float(match.group(6))


def rotation_block(inputs: int) -> int:
    """The inputs one Hadamard block of a Linear with ``inputs`` mixes: 128 (the scales' group), or the largest power
    of two that divides ``inputs`` where 128 does not (a narrower model's 80 inputs rotate in blocks of 16)."""
    return min(ROWS_GROUP, inputs & -inputs)


def rotated_after_first(names: list[str], model: torch.nn.Module, form: dict, rotation: str) -> dict[str, dict]:
    """``method="mixed"``'s forms: ``form`` for every Linear ``names`` holds, every one but the first (a patch's
    few values) with ``input_rotation=rotation`` in its ``rotation_block`` (no rotation: none of them)."""
    forms = {}
    for index, name in enumerate(names):
        forms[name] = dict(form)
        if rotation != "none" and index:
            inputs = model.get_submodule(name).in_features
            forms[name] |= {"input_rotation": rotation, "rotation_block": rotation_block(inputs)}
    return forms


def prepare_lowbit(
    bits: int | str, group: int, scales: str = "rounded", bias_dtype: str = "model", rotation: str = "none"
) -> Callable:
    """An arm's ``prepare``: every Linear as ``method="lowbit"`` (full weight in ``bits``, groups of ``group``,
    ``scales`` its ``weight_scales``, ``bias_dtype`` its bias's; every one but the first with ``input_rotation``
    ``rotation``)."""

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        options = dict(weight_bits=bits, weight_group_size=group, weight_scales=scales, bias_dtype=bias_dtype)
        if rotation == "none":
            apply_compression(model, CompressionConfig(method="lowbit", **options))
            return
        forms = rotated_after_first(scope_names(model, "all"), model, {"method": "lowbit", **options}, rotation)
        apply_compression(model, CompressionConfig(method="mixed", forms=forms))

    return prepare


def rows_arm(name: str) -> tuple[int, float] | None:
    """(bits of the wide rows, their fraction) of a ``rows-<bits>-<fraction>`` arm name, or None."""
    match = ROWS_ARM.fullmatch(name)
    return None if match is None else (int(match.group(1)), float(match.group(2)))


def ends_arm(name: str) -> tuple[int, int, str, int | str] | None:
    """(bits of the first Linear, bits of the last, ``input_rotation``, bits of every other one) of an
    ``ends-<bits>-<bits>[-<bits>][-hadamard|-randomized-hadamard]`` arm name, or None."""
    match = ENDS_ARM.fullmatch(name)
    if match is None:
        return None
    middle = "ternary" if match.group(3) is None else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), match.group(4) or "none", middle


def prepare_forms(slots: list[LinearSlot], allocation: Allocation, shared: dict[str, str] | None = None) -> Callable:
    """An arm's ``prepare``: every Linear in its allocated form (``method="mixed"``, built from the fresh weights),
    trained in the precision it is stored in (Biprop layers keep their scores in the state dict while they train:
    model selection restores it); each Linear of ``shared`` ({module: source}) computing with its source's."""
    forms = mixed_forms(slots, allocation) | shared_forms(shared)

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        if forms:
            apply_compression(model, CompressionConfig(method="mixed", forms=forms))

    return prepare


def byte_derived_arms(
    name: str,
    slots: list[LinearSlot],
    budget: float,
    seed: int,
    draws: int,
    sensitivity: Callable[[], dict[str, dict]],
    searched: Allocation,
    shared: dict[str, str] | None = None,
) -> list[tuple[str, int | None, Callable | None, Allocation | None]]:
    """(run name, draw, prepare, allocation) of a derived arm at ``budget`` bytes (the search's final bytes, its
    final forms ``searched``; the Linears of ``shared`` reusing their sources' as the search's did); a uniform form
    that cannot take every Linear within them has no run (prepare None)."""
    if name == "searched-bytes":
        allocations = [(None, dict(searched))]
    elif name.startswith("uniform-"):
        allocations = [(None, uniform_forms(slots, budget, name.split("-")[1]))]
    elif name == "random-bytes":
        allocations = [
            (draw, random_allocation(slots, budget, random.Random(1000 * seed + draw))) for draw in range(draws)
        ]
    else:
        allocations = [(None, greedy_allocation(slots, budget, sensitivity()))]
    return [
        (name, draw, None if chosen is None else prepare_forms(slots, chosen, shared), chosen)
        for draw, chosen in allocations
    ]


class IntWeight(torch.nn.Module):
    """Weight rounded as ``LowBitTensor`` stores it (``bits``, groups of 32 along a row), straight-through."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits = bits

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return rounded(weight, self.bits, GROUP)


def prepare_int_qat(bits: int) -> Callable:
    """An arm's ``prepare``: every Linear trains with int-``bits`` weights; returns their deployed disk bytes."""

    def prepare(model: torch.nn.Module, final_ranks) -> dict[str, int]:
        packed = {}
        for name in scope_names(model, "all"):
            module = model.get_submodule(name)
            parametrize.register_parametrization(module, "weight", IntWeight(bits))
            codes = stored_form((module.out_features, module.in_features), bits, GROUP).storage_bits() // 8
            packed[name] = codes + (module.bias.numel() * 4 if module.bias is not None else 0)
        return packed

    return prepare


class FirstWindows(torch.utils.data.Dataset):
    """The first ``count`` windows of ``windows``, scored as the whole set is (``scored_mask``: missing values and
    covariates unscored), so a sensitivity measured on them counts what the test metric counts."""

    def __init__(self, windows: torch.utils.data.Dataset, count: int) -> None:
        self.windows, self.count = windows, min(count, len(windows))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.windows[index]

    def scored_mask(self, index: int) -> torch.Tensor:
        if hasattr(self.windows, "scored_mask"):
            return self.windows.scored_mask(index)
        return torch.ones_like(self.windows[index]["future_values"], dtype=torch.bool)


class RowWidths(torch.nn.Module):
    """Two widths inside one weight, straight-through: the first ``wide`` rows at ``bits``, the rest ternary, each
    against learned group scales (LSQ, ``learned_scales.py``, started from the weight given here). Trained from the
    first step, there is no trained weight to choose rows by: the wide ones are the first, and training fills them."""

    def __init__(self, weight: torch.Tensor, bits: int, wide: int) -> None:
        super().__init__()
        self.bits, self.wide = bits, wide
        with torch.no_grad():
            scale, minimum = initial_scales(weight[:wide], bits, ROWS_GROUP)
            self.wide_scale, self.wide_minimum = torch.nn.Parameter(scale), torch.nn.Parameter(minimum)
            scale, minimum = initial_scales(weight[wide:], "ternary", ROWS_GROUP)
            self.scale, self.minimum = torch.nn.Parameter(scale), torch.nn.Parameter(minimum)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        wide = learned_values(weight[: self.wide], self.wide_scale, self.wide_minimum, self.bits, ROWS_GROUP)
        narrow = learned_values(weight[self.wide :], self.scale, self.minimum, "ternary", ROWS_GROUP)
        return torch.cat((wide, narrow))


class HalfBias(torch.nn.Module):
    """The bias as fp16 stores it, straight-through."""

    def forward(self, bias: torch.Tensor) -> torch.Tensor:
        return fp16_rounded(bias)


def stored_in_fp16_bias(module: torch.nn.Module, weight: torch.nn.Module, weight_bits: int) -> int:
    """Train ``module``'s weight through the parametrization ``weight`` and its bias as fp16 stores it, both
    straight-through; returns the bytes they would store: ``weight_bits`` and the fp16 bias."""
    parametrize.register_parametrization(module, "weight", weight)
    if module.bias is not None:
        parametrize.register_parametrization(module, "bias", HalfBias())
        weight_bits += 16 * module.bias.numel()
    return math.ceil(weight_bits / 8)


def prepare_rows(bits: int, fraction: float) -> Callable:
    """An arm's ``prepare``: in every Linear, the first ``ceil(fraction · rows)`` rows at ``bits`` and the rest
    ternary, in groups of 128 with learned scales, and the bias in fp16 (the bytes the wide rows take); returns their
    disk bytes: both parts' codes and scales, a bit a row saying which part it is in, and the fp16 bias."""

    def prepare(model: torch.nn.Module, final_ranks) -> dict[str, int]:
        packed = {}
        for name in scope_names(model, "all"):
            module = model.get_submodule(name)
            rows, columns = module.out_features, module.in_features
            wide = min(rows, math.ceil(fraction * rows))
            stored_bits = (
                stored_form((wide, columns), bits, ROWS_GROUP).storage_bits()
                + stored_form((rows - wide, columns), "ternary", ROWS_GROUP).storage_bits()
                + rows
            )
            widths = RowWidths(module.weight.detach(), bits, wide)
            packed[name] = stored_in_fp16_bias(module, widths, stored_bits)
        return packed

    return prepare


def ends_forms(
    names: list[str],
    model: torch.nn.Module,
    first: int,
    last: int,
    rotation: str = "none",
    middle: int | str = "ternary",
) -> dict:
    """``method="mixed"``'s forms for Linears ``names`` (in ``model``'s order): the first (a model's input
    embedding) at ``first`` bits, the last (its head) at ``last``, every other one at ``middle``, all in groups of 128
    with learned scales and fp16 biases; every one but the first with ``input_rotation=rotation``
    (``rotated_after_first``)."""
    options = {"method": "lowbit", "weight_group_size": ROWS_GROUP, "weight_scales": "learned", "bias_dtype": "float16"}
    forms = rotated_after_first(names, model, options, rotation)
    for index, name in enumerate(names):
        forms[name]["weight_bits"] = first if index == 0 else last if index == len(names) - 1 else middle
    return forms


def shared_after_first_layer(forms: dict[str, dict]) -> dict[str, dict]:
    """``forms`` with every Linear of a numbered layer after the first (``….layers.<i>.…``, i > 0) reusing its
    counterpart in layer 0 (``{"method": "shared"}``): cross-layer sharing, one layer's bytes."""
    shared = {}
    for name, form in forms.items():
        match = LAYER_INDEX.fullmatch(name)
        if match is not None and match.group(2) != "0":
            form = {"method": "shared", "source": f"{match.group(1)}0{match.group(3)}"}
        shared[name] = form
    return shared


def shared_linears(model: torch.nn.Module) -> dict[str, str]:
    """{Linear: its counterpart in layer 0} for every Linear of a numbered layer after the first
    (``shared_after_first_layer``'s shares)."""
    forms = shared_after_first_layer({name: {} for name in scope_names(model, "all")})
    return {name: form["source"] for name, form in forms.items() if form}


def prepare_shared_dense(model: torch.nn.Module, final_ranks) -> None:
    """An arm's ``prepare``: the dense model whose layers after the first compute with the first's Linears."""
    apply_compression(model, CompressionConfig(method="mixed", forms=shared_forms(shared_linears(model))))


def prepare_ends(
    first: int, last: int, rotation: str = "none", middle: int | str = "ternary", shared: bool = False
) -> Callable:
    """An arm's ``prepare``: ``ends_forms`` as ``method="mixed"`` (the bytes are those the library stores); with
    ``shared`` the layers after the first reuse the first's Linears (``shared_after_first_layer``)."""

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        forms = ends_forms(scope_names(model, "all"), model, first, last, rotation, middle)
        if shared:
            forms = shared_after_first_layer(forms)
        apply_compression(model, CompressionConfig(method="mixed", forms=forms))

    return prepare
