"""The Smartformer recipe's arm catalogue: which runs a comparison trains or derives, in which order, and the
baselines at the parameter count each seed's search ended with."""

from __future__ import annotations

import argparse
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from accelerate import PartialState

from hf_tensorcompress.methods.lowbit.config import BIAS_DTYPES, WEIGHT_SCALES
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS, INPUT_ROTATIONS
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import check_budget_fits
from hf_tensorcompress.search.baselines import module_ranks, random_ranks, total_params, uniform_ranks
from hf_tensorcompress.search.config import FORM_KINDS, SHARE_BY
from hf_tensorcompress.search.forms import Form, linear_slots

from .byte_arms import (
    BYTE_DERIVED,
    BYTE_WIDTHS,
    INT_QAT_ARMS,
    dense_fraction,
    ends_arm,
    lowbit_arm,
    prepare_ends,
    prepare_int_qat,
    prepare_lowbit,
    prepare_rows,
    rows_arm,
)
from .forecasters import Size
from .narrow_arms import Shape, narrow_arm, narrower
from .quantization_arms import (
    FACTOR_SCHEMES,
    PTQ_ARMS,
    QAT_ARMS,
    TRAINED_FACTOR_BITS,
    factor_transform,
    prepare_svd_all,
    prepare_ternary,
    ptq_transform,
    svd_all_ranks,
)
from .vector_arms import prepare_vq, vq_arm

#: Arms derived from each seed's Smartformer run: its final attention parameter count, spent other ways; the
#: ``-scheduled`` ones train at full rank until the step the search ended and take their ranks there.
DERIVED = ("uniform-cp", "random-ranks", "searched-ranks", "uniform-cp-scheduled", "random-ranks-scheduled")


@dataclass
class Plan:
    """``arms``: (name, method, rank, make_search(seed) or None) in run order; ``prepares``: arms that build their
    model themselves (name -> ``prepare(model, final_ranks)``); ``post_arms``: arms that round a trained run's
    weights (name -> (source run, ``transform``)); ``switch_step``: where the ``-scheduled`` svd-all arms are cut;
    ``dense_first``: arms that train dense for a share of the steps before ``prepare`` (name -> those steps);
    ``shapes``: arms that train a narrower fresh model (name -> its d_model, encoder layers and FFN width)."""

    arms: list[tuple]
    switch_step: int
    prepares: dict[str, Callable] = field(default_factory=dict)
    post_arms: dict[str, tuple[str, Callable]] = field(default_factory=dict)
    dense_first: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)


def search_factory(size: Size, args: argparse.Namespace) -> Callable[..., SearchConfig]:
    """``make(seed, reward)``: a fresh search config per run (the trainer keeps it); ``in_bytes``: the search over the
    form of every Linear under ``--budget-ratio`` of their fp32 bytes."""

    def make(seed: int, reward: str = "loss", in_bytes: bool = False) -> SearchConfig:
        if in_bytes:
            return SearchConfig(
                seed=seed,
                interval=size.interval,
                consecutive_actions=size.consecutive_actions,
                max_actions_per_layer=size.max_actions_per_layer,
                max_candidates=args.max_candidates,
                byte_budget=args.budget_ratio,
                forms=tuple(args.forms),
                factor_widths=tuple(args.factor_widths),
                keep_ratios=tuple(args.keep_ratios),
                weight_group_sizes=tuple(args.weight_group_sizes),
                weight_scales=tuple(args.weight_scales),
                input_rotations=tuple(args.input_rotations),
                bias_dtype=args.bias_dtype,
                reward=args.byte_reward,
                validation_batches=args.validation_batches,
                front_only=args.front_only,
                share_by=args.share_by,
                pace=args.pace,
                start=args.search_start,
                warmup=args.search_warmup,
            )
        return SearchConfig(
            seed=seed,
            interval=size.interval,
            consecutive_actions=size.consecutive_actions,
            max_actions_per_layer=size.max_actions_per_layer,
            param_budget=args.budget,
            reward=reward,
            validation_batches=args.validation_batches,
        )

    return make


def build_plan(size: Size, args: argparse.Namespace, shape_model: torch.nn.Module) -> Plan:
    """Every arm of the comparison, ``--runs`` applied; a ``ValueError`` names a flag that cannot be used."""
    if args.budget_ratio is not None and PartialState().is_main_process:
        print(
            f"byte search: the form of every Linear ({' '.join(args.forms)}) within --budget-ratio "
            f"{args.budget_ratio:.4g} of their fp32 bytes"
        )
    search = search_factory(size, args)
    plan = Plan(
        [("dense", None, 1.0, None), ("smartformer", "cp", 1.0, search)],
        args.switch_step or size.steps // 2,
        {name: prepare_ternary(name.rpartition("-")[2]) for name in QAT_ARMS},
        {name: ("dense", ptq_transform(*name.split("-")[1:])) for name in PTQ_ARMS},
    )
    plan.arms += [("smartformer-validation-reward", "cp", 1.0, lambda seed: search(seed, "validation_loss"))]
    plan.arms += [("svd-smartformer", "svd", 1.0, search)]
    plan.arms += [(f"cp-fixed-{ratio:g}", "cp", ratio, None) for ratio in size.grid]
    plan.arms += [(name, "cp", None, None) for name in DERIVED]
    plan.arms += [(name, None, None, None) for name in (*PTQ_ARMS, *QAT_ARMS)]
    if any(not 0.0 < ratio <= 1.0 for ratio in args.all_linear_ratios):
        raise ValueError(f"--all-linear-ratios {args.all_linear_ratios}: each must be in (0, 1]")
    for ratio in args.all_linear_ratios:
        add_svd_all(plan, ratio, shape_model)
    if args.budget_ratio is not None:
        add_byte_arms(plan, search)
    for name in args.runs or []:
        if (narrow := narrow_arm(name)) is not None:
            add_narrow_arm(plan, name, *narrow, size, args.model_path)
        else:
            add_named_arm(plan, name, name, size.steps)
    if args.runs is not None:
        plan.arms = chosen_runs(plan, args.runs)
    check_switch_step(plan, size.steps, args.switch_step is not None)
    check_dense_first(plan, size.steps)
    check_distill(plan, args.distill)
    if any(entry[0] == "smartformer-bytes" for entry in plan.arms):  # before any arm trains, not after dense
        config = search(0, in_bytes=True)
        try:
            check_budget_fits(linear_slots(shape_model, config), config.byte_budget)
        except ValueError as error:
            raise ValueError(
                f"--budget-ratio with these --forms, --factor-widths and --max-candidates: {error}"
            ) from None
    return plan


def add_named_arm(plan: Plan, name: str, arm: str, steps: int) -> None:
    """The arm ``name``, trained as the ``lowbit-``, ``rows-``, ``ends-`` or ``vq-`` arm ``arm`` says (a ``lowbit-``
    arm after dense steps if it says so); nothing for any other name."""
    prepares = (
        (lowbit_arm, prepare_lowbit),
        (rows_arm, prepare_rows),
        (ends_arm, prepare_ends),
        (vq_arm, prepare_vq),
    )
    for settings, prepare in prepares:
        if (found := settings(arm)) is not None:
            plan.arms.append((name, None, None, None))
            plan.prepares[name] = prepare(*found)
            break
    if (fraction := dense_fraction(arm)) is not None:
        plan.dense_first[name] = round(fraction * steps)


def add_narrow_arm(plan: Plan, name: str, shape: Shape, arm: str | None, size: Size, path: str | None) -> None:
    """The ``narrow-`` arm ``name``: a fresh model of ``shape``, dense or as the named arm ``arm`` (an ``ends-`` arm
    whose later layers share the first's Linears where the shape says so)."""
    narrower(size, shape)  # refuses a shape the model cannot take, before any arm trains
    if path is not None:
        raise ValueError(f"--runs {name} trains a fresh narrower model; it cannot start from --model-path {path}")
    shared = shape[3]
    if shared and (arm is None or ends_arm(arm) is None):
        raise ValueError(f"--runs {name}: -shared takes an ends- arm after it (e.g. {name}-ends-8-4-hadamard)")
    if shared:
        plan.arms.append((name, None, None, None))
        plan.prepares[name] = prepare_ends(*ends_arm(arm), shared=True)
    elif arm is None:
        plan.arms.append((name, None, None, None))
    else:
        add_named_arm(plan, name, arm, size.steps)
    plan.shapes[name] = shape


def check_distill(plan: Plan, weight: float | None) -> None:
    """``--distill`` teaches every arm with the seed's dense run, so that run must come first."""
    if weight is not None and (not plan.arms or plan.arms[0][0] != "dense"):
        raise ValueError("--distill teaches every arm with this seed's dense run; add dense to --runs")


def check_dense_first(plan: Plan, steps: int) -> None:
    """An ``-after-dense-<fraction>`` arm needs steps in both of its phases."""
    for name, dense_steps in plan.dense_first.items():
        if not 1 <= dense_steps < steps:
            raise ValueError(
                f"--runs {name} with --steps {steps}: {dense_steps} dense steps leave no step of one phase; "
                "choose a fraction that leaves at least one step of each, or train longer"
            )


def check_switch_step(plan: Plan, steps: int, passed: bool) -> None:
    """The ``-scheduled`` svd-all arms need a cut inside the run; the error names the flag the user passed (or, with
    the derived default, ``--steps`` and ``--runs``)."""
    scheduled = [entry[0] for entry in plan.arms if entry[0] in plan.prepares and entry[0].endswith("-scheduled")]
    if not scheduled or 1 <= plan.switch_step < steps:
        return
    if passed:
        raise ValueError(f"--switch-step {plan.switch_step} must be in [1, {steps}) (the runs' steps)")
    raise ValueError(
        f"--steps {steps}: the scheduled runs {scheduled[:2]}{' …' if len(scheduled) > 2 else ''} switch rank at half "
        "the steps, which needs --steps >= 2; train longer, or leave them out with --runs"
    )


def add_svd_all(plan: Plan, ratio: float, shape_model: torch.nn.Module) -> None:
    """The ``svd-all-<ratio>`` arms: trained in fp32 or with 4-bit factors, from the start or scheduled, and the
    fp32 ones' factors rounded after training (``+int8`` ...)."""
    for trained_bits in ("", f"-q{TRAINED_FACTOR_BITS[0]}"):
        for suffix in ("", "-scheduled"):
            name = f"svd-all-{ratio:g}{trained_bits}{suffix}"
            plan.arms.append((name, None, svd_all_ranks(shape_model, ratio), None))
            plan.prepares[name] = prepare_svd_all(ratio, TRAINED_FACTOR_BITS if trained_bits else None)
            for scheme, bits in FACTOR_SCHEMES.items():
                if not trained_bits:
                    plan.arms.append((f"{name}+{scheme}", None, None, None))
                    plan.post_arms[f"{name}+{scheme}"] = (name, factor_transform(*bits))


def run_names_help() -> str:
    """The run names ``--runs`` accepts, for ``--help`` (the svd-all and cp-fixed names follow their flags)."""
    names = [
        "dense",
        "smartformer",
        "smartformer-validation-reward",
        "svd-smartformer",
        "cp-fixed-<ratio> (each --grid ratio)",
        *DERIVED,
        *PTQ_ARMS,
        *QAT_ARMS,
        "lowbit-<bits>-g<group>[-learned][-fp16-bias][-hadamard][-after-dense-<fraction>] (every Linear as "
        'method="lowbit", e.g. lowbit-2-g128; -learned: weight_scales="learned"; -fp16-bias: bias_dtype="float16"; '
        "-hadamard: every Linear but the first with that input_rotation; -after-dense-0.5: half the steps dense first)",
        "rows-<bits>-<fraction> (the first fraction of every Linear's rows at bits, the rest ternary)",
        "ends-<bits>-<bits>[-<bits>][-hadamard|-randomized-hadamard] (the first Linear at the first width, the last "
        "at the second, the rest ternary or at the third, 2 or 1; -hadamard: every Linear but the first with that "
        "input_rotation, blocks of 128 or fewer)",
        "vq-<dim>-<bits> (every Linear's weight as runs of dim weights, each a bits-wide index into a learned codebook)",
        "narrow-<d_model>[x<layers>][-ffn<width>][-shared][-<arm>] (a fresh model of that narrower width, the FFN and "
        "heads in proportion, x<layers>: that many encoder layers, -ffn<width>: that FFN width, -shared: the layers "
        "after the first reuse its Linears (an ends- arm), dense or as that lowbit-, rows-, ends- or vq- arm; bytes "
        "against the full model's)",
        "with --budget-ratio: smartformer-bytes",
        *BYTE_DERIVED,
        *INT_QAT_ARMS,
        "svd-all-<ratio>[-q4][-scheduled] and svd-all-<ratio>[-scheduled]+<int8|int4|int2> (each --all-linear-ratios ratio)",
    ]
    text = "runs (--runs NAME ...): " + ", ".join(names)
    return "\n".join(textwrap.wrap(text, 100, break_on_hyphens=False, break_long_words=False))


def add_byte_arms(plan: Plan, search: Callable[..., SearchConfig]) -> None:
    """``smartformer-bytes`` (every Linear dense, then searched in form), the allocations derived from each seed's
    search (their ``prepare`` is made per seed) and int-N weight QAT."""
    plan.arms.append(("smartformer-bytes", None, None, lambda seed: search(seed, in_bytes=True)))
    plan.arms += [(name, None, None, None) for name in BYTE_DERIVED]
    plan.arms += [(name, None, None, None) for name in INT_QAT_ARMS]
    plan.prepares.update({name: prepare_int_qat(int(name.split("-")[1][3:])) for name in INT_QAT_ARMS})


def chosen_runs(plan: Plan, runs: list[str]) -> list[tuple]:
    """The arms ``--runs`` names, in plan order, once the runs they depend on are among them."""
    unknown = sorted(set(runs) - {entry[0] for entry in plan.arms})
    if unknown:
        raise ValueError(f"--runs {runs}: unknown {unknown}; choose from {[e[0] for e in plan.arms]}")
    if set(runs) & set(BYTE_DERIVED) and "smartformer-bytes" not in runs:
        raise ValueError(
            f"--runs {runs}: {sorted(set(runs) & set(BYTE_DERIVED))} take their bytes from smartformer-bytes; add it"
        )
    if "greedy-bytes" in runs and "dense" not in runs:
        raise ValueError(f"--runs {runs}: greedy-bytes measures each layer's sensitivity on the dense run; add dense")
    if set(runs) & set(DERIVED) and "smartformer" not in runs:
        raise ValueError(
            f"--runs {runs}: {sorted(set(runs) & set(DERIVED))} take their parameter count from "
            "the Smartformer search of the same seed; add smartformer"
        )
    missing = sorted({plan.post_arms[name][0] for name in runs if name in plan.post_arms} - set(runs))
    if missing:
        raise ValueError(f"--runs {runs}: the post-training arms round the weights of {missing}; add them")
    return [entry for entry in plan.arms if entry[0] in runs]


def derived_arms(name: str, groups, ranks: dict[str, int], seed: int, draws: int) -> list[tuple[str, dict, int | None]]:
    """(run name, {module: rank}, draw) of a derived arm at the search's final parameter count: one rank in every
    layer (closest count), ``draws`` random assignments (never above the count, within one rank-1 component of
    it), or the search's own final ranks trained from the start. A ``-scheduled`` name gets the same ranks as
    its base arm (the same draws too)."""
    params = total_params(groups, ranks)
    base = name.removesuffix("-scheduled")
    if base == "uniform-cp":
        return [(name, module_ranks(groups, uniform_ranks(groups, params)), None)]
    if base == "random-ranks":
        return [
            (name, module_ranks(groups, random_ranks(groups, params, random.Random(1000 * seed + draw))), draw)
            for draw in range(draws)
        ]
    return [(name, module_ranks(groups, ranks), None)]


def search_end_step(trace: list[dict]) -> int:
    """The optimizer step at which the search decided its last layer (its last decision if it never finished)."""
    if not trace:  # no stage ended (a run shorter than one interval): nothing was cut, so nothing to wait for
        return 1
    return next((record["step"] for record in trace if record["done"]), trace[-1]["step"])


def add_byte_arguments(parser: argparse.ArgumentParser, fraction: Callable[[str], float]) -> None:
    """The byte search's flags: its budget, the forms and their widths, group sizes and keep ratios."""
    parser.add_argument(
        "--budget-ratio",
        type=fraction,
        default=None,
        help="byte budget of the smartformer-bytes search, a fraction of the fp32 bytes of every Linear (e.g. 1/16); "
        "adds smartformer-bytes, the allocations at its bytes and int4/int2 weight QAT",
    )
    parser.add_argument(
        "--forms", nargs="+", default=list(FORM_KINDS), choices=FORM_KINDS, help="the forms the byte search offers"
    )
    parser.add_argument(
        "--factor-widths", type=factor_width, nargs="+", default=list(BYTE_WIDTHS), help=byte_widths_help()
    )
    parser.add_argument(
        "--weight-group-sizes",
        type=group_size,
        nargs="+",
        default=[32],
        help="group sizes of the lowbit form's weights (input columns per scale; 'row': one scale per output row)",
    )
    parser.add_argument(
        "--weight-scales",
        nargs="+",
        choices=WEIGHT_SCALES,
        default=["rounded"],
        help="how the lowbit form's group scales are set, each offered to the byte search and its allocations: "
        "rounded from the weights at every step, or learned with them (SearchConfig.weight_scales)",
    )
    parser.add_argument(
        "--input-rotations",
        nargs="+",
        choices=INPUT_ROTATIONS,
        default=["none"],
        help="how the lowbit form's inputs are rotated, each offered to the byte search and its allocations (blocks of "
        "128 inputs; SearchConfig.input_rotations)",
    )
    parser.add_argument(
        "--bias-dtype",
        choices=BIAS_DTYPES,
        default="model",
        help="the lowbit form's bias, in the byte search and its allocations: as the model holds it, or float16 "
        "(SearchConfig.bias_dtype)",
    )
    parser.add_argument("--keep-ratios", type=float, nargs="+", default=[0.5], help="keep ratios of the biprop form")
    parser.add_argument(
        "--max-candidates", type=int, default=10, help="ranks the svd and cp forms offer (parameter ratios 1/n … 1)"
    )
    parser.add_argument(
        "--search-schedule",
        type=int,
        nargs=3,
        metavar=("INTERVAL", "AGREEING", "MOST"),
        help="every search's stage (optimizer steps), the agreeing actions that decide a layer, and the most actions "
        "a layer gets (default by --size: 8 3 6 for demo and medium)",
    )
    parser.add_argument(
        "--search-start",
        type=form_label,
        default="dense",
        help="the form every Linear starts the byte search in: dense (the model as given) or a form the search may "
        "choose for every Linear, e.g. lowbit:2/g32 (SearchConfig.start)",
    )
    parser.add_argument(
        "--front-only",
        action="store_true",
        help="per-layer sensitivity: the byte search chooses each Linear's form among its Pareto front of bytes and "
        "the loss increase each form gives when first tried (SearchConfig.front_only)",
    )
    parser.add_argument(
        "--share-by",
        choices=SHARE_BY,
        default="fp32_bytes",
        help="what each Linear's share of the byte search's budget is proportional to: its fp32 bytes, or its bytes "
        "in the greedy allocation by each form's measured loss when the agent first acts (SearchConfig.share_by)",
    )
    parser.add_argument(
        "--pace",
        type=pace_value,
        default=SearchConfig.pace,
        help="the byte search offers each Linear the forms within ± this fraction of its share of the bytes left "
        f"(default {SearchConfig.pace}; none: every form within the budget; SearchConfig.pace)",
    )
    parser.add_argument(
        "--search-warmup",
        type=int,
        default=0,
        metavar="STEPS",
        help="optimizer steps the byte search's model trains in its start form before the agent first acts, so its "
        "rewards and --front-only's measurements are of a trained model (SearchConfig.warmup; default 0)",
    )
    parser.add_argument(
        "--byte-reward",
        choices=("loss", "validation_loss"),
        default="loss",
        help="the byte search's reward: the training loss of each stage or the loss on --validation-batches held-out "
        "batches",
    )


def byte_widths_help() -> str:
    return (
        f"factor widths the byte search chooses among per Linear (default {' '.join(map(str, BYTE_WIDTHS))}; 16 is "
        "bfloat16 factors, ternary BitNet b1.58's three levels per group five codes a byte; 1, a sign per value, "
        "only where named)"
    )


def pace_value(text: str) -> float | None:
    """One ``--pace`` value: a fraction >= 0, or ``none`` (no pacing)."""
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction >= 0 (e.g. 0.25) or none")
    return value


def group_size(text: str) -> int | None:
    """One ``--weight-group-sizes`` value: a positive int, or ``row`` (one group per output row)."""
    if text == "row":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a group size is a positive int or 'row'")
    return int(text)


def factor_width(text: str) -> int | str:
    """One ``--factor-widths`` value: a stored factor width (``FACTOR_WIDTHS``), as an int or ``"ternary"``."""
    value = int(text) if text.isdigit() else text.lower()
    if value not in FACTOR_WIDTHS:
        raise argparse.ArgumentTypeError(f"{text!r}: choose among {' '.join(map(str, FACTOR_WIDTHS))}")
    return value


def form_label(text: str) -> str:
    """``--search-start``: a form's label (``Form.from_label``), checked here and kept as text (``SearchConfig.start``)."""
    try:
        Form.from_label(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
