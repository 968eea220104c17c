"""The Smartformer recipe's byte-search flags: the budget, the search's model shape, the forms offered and their
widths, group sizes, scales, rotations and keep ratios, and how the search is paced and rewarded."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hf_tensorcompress.cli.common import positive_int
from hf_tensorcompress.methods.lowbit.config import BIAS_DTYPES, WEIGHT_SCALES
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS, INPUT_ROTATIONS
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.config import FORM_KINDS, GREEDY_START, POLICIES, REWARD_BASELINES, SHARE_BY
from hf_tensorcompress.search.forms import Form

from .byte_arms import BYTE_WIDTHS


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
        "--search-shape",
        default=None,
        metavar="NARROW",
        help="the byte search's model and its allocations': a fresh model of that shape (narrow-<d_model>[x<layers>]"
        "[-ffn<width>][-shared], e.g. narrow-128x4-shared: one layer's Linears used by four; SearchConfig.shared), "
        "--budget-ratio still of the full model's fp32 Linears; adds the shape's dense arm, which greedy measures",
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
        "--search-epsilon",
        type=probability,
        nargs=3,
        metavar=("START", "END", "DECAY"),
        help="every search's ε-greedy exploration: ε at the first action, its floor, and the factor it shrinks by per "
        "action (SearchConfig.epsilon_start / epsilon_end / epsilon_decay; default "
        f"{SearchConfig.epsilon_start} {SearchConfig.epsilon_end} {SearchConfig.epsilon_decay})",
    )
    parser.add_argument(
        "--search-policy",
        choices=POLICIES,
        default=SearchConfig.policy,
        help="what every search's agent does when it does not explore: the actor's most probable action (argmax, "
        "the paper's) or one drawn from it (sample: a Linear tries its forms until k agree or the cap decides it; "
        "SearchConfig.policy)",
    )
    parser.add_argument(
        "--search-agent-lr",
        type=positive_number,
        default=SearchConfig.learning_rate,
        metavar="LR",
        help="every search's actor-critic learning rate, one Adam step per action (SearchConfig.learning_rate; "
        f"default {SearchConfig.learning_rate}, the paper's)",
    )
    parser.add_argument(
        "--search-replay",
        type=replay_epochs,
        default=SearchConfig.replay_epochs,
        metavar="EPOCHS",
        help="after each reward, this many more actor-critic steps on every transition so far, so a short search's "
        "rewards move the agent (SearchConfig.replay_epochs; default 0, the paper's one step a reward)",
    )
    parser.add_argument(
        "--search-start",
        type=form_label,
        default="dense",
        help="the form every Linear starts the byte search in: dense (the model as given), a form the search may "
        "choose for every Linear, e.g. lowbit:2/g32, or greedy (the greedy allocation by each form's measured loss "
        "at the first stage end, which the agent then refines; SearchConfig.start)",
    )
    parser.add_argument(
        "--search-episodes",
        type=positive_int,
        default=1,
        metavar="PASSES",
        help="passes of the byte search over every Linear: each after the first takes the Linears up again, the "
        "others in the forms they hold (SearchConfig.episodes; default 1)",
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
        "--reward-baseline",
        choices=REWARD_BASELINES,
        default="previous_stage",
        help="what the byte search's reward compares a stage's loss with: the loss before the action, or the Linear's "
        "previous form rebuilt from the same weights, bytes priced at the budget's going rate (needs --byte-reward "
        "validation_loss; SearchConfig.reward_baseline)",
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


def checked_number(text: str, accept: Callable[[float], bool], expected: str) -> float:
    """``text`` as a float that ``accept`` takes; anything else (not a number too) is an argparse error saying
    ``expected``."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not accept(value):
        raise argparse.ArgumentTypeError(f"{text!r}: {expected}")
    return value


def replay_epochs(text: str) -> int:
    """``--search-replay``: a whole number >= 0."""
    return int(checked_number(text, lambda value: value >= 0 and value.is_integer(), "a whole number >= 0 (e.g. 10)"))


def pace_value(text: str) -> float | None:
    """One ``--pace`` value: a fraction >= 0, or ``none`` (no pacing)."""
    if text.lower() == "none":
        return None
    return checked_number(text, lambda value: value >= 0, "a fraction >= 0 (e.g. 0.25) or none")


def probability(text: str) -> float:
    """One ``--search-epsilon`` value: a number in [0, 1]."""
    return checked_number(text, lambda value: 0.0 <= value <= 1.0, "a number in [0, 1] (e.g. 0.5)")


def positive_number(text: str) -> float:
    """``--search-agent-lr``: a number > 0."""
    return checked_number(text, lambda value: value > 0, "a number > 0 (e.g. 0.001)")


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
    """``--search-start``: a form's label (``Form.from_label``) or ``greedy``, checked here and kept as text
    (``SearchConfig.start``)."""
    if text == GREEDY_START:
        return text
    try:
        Form.from_label(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; or {GREEDY_START} (the greedy allocation)") from None
    return text
