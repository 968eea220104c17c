"""The Smartformer recipe's arm catalogue: which runs a comparison trains or derives, in which order, and the
baselines at the parameter count each seed's search ended with."""

from __future__ import annotations

import argparse
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from accelerate import PartialState

from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import check_budget_fits
from hf_tensorcompress.search.baselines import module_ranks, random_ranks, total_params, uniform_ranks
from hf_tensorcompress.search.forms import linear_slots

from .byte_arms import (
    BYTE_DERIVED,
    INT_QAT_ARMS,
    dense_fraction,
    ends_arm,
    lowbit_arm,
    prepare_ends,
    prepare_int_qat,
    prepare_lowbit,
    prepare_rows,
    prepare_shared_dense,
    rows_arm,
)
from .forecasters import Size, build_model
from .narrow_arms import SearchShape, Shape, narrow_arm, narrower, search_shape
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
    ``shapes``: arms that train a narrower fresh model (name -> its d_model, encoder layers and FFN width);
    ``search_shape``: the dense arm of the byte search's shape (``--search-shape``), which greedy measures."""

    arms: list[tuple]
    switch_step: int
    prepares: dict[str, Callable] = field(default_factory=dict)
    post_arms: dict[str, tuple[str, Callable]] = field(default_factory=dict)
    dense_first: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    search_shape: str | None = None


def search_factory(
    size: Size, args: argparse.Namespace, shaped: SearchShape | None = None
) -> Callable[..., SearchConfig]:
    """``make(seed, reward)``: a fresh search config per run (the trainer keeps it); ``in_bytes``: the search over the
    form of every Linear under ``--budget-ratio`` of their fp32 bytes (on ``shaped``'s model: its budget and shares)."""

    agent = dict(zip(("epsilon_start", "epsilon_end", "epsilon_decay"), args.search_epsilon or ()))
    agent.update(learning_rate=args.search_agent_lr, policy=args.search_policy, replay_epochs=args.search_replay)

    def make(seed: int, reward: str = "loss", in_bytes: bool = False) -> SearchConfig:
        if in_bytes:
            return SearchConfig(
                seed=seed,
                **agent,
                interval=size.interval,
                consecutive_actions=size.consecutive_actions,
                max_actions_per_layer=size.max_actions_per_layer,
                max_candidates=args.max_candidates,
                byte_budget=args.budget_ratio if shaped is None else shaped.byte_budget,
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
                reward_baseline=args.reward_baseline,
                pace=args.pace,
                start=args.search_start,
                warmup=args.search_warmup,
                episodes=args.search_episodes,
                shared=None if shaped is None or not shaped.shared else dict(shaped.shared),
            )
        return SearchConfig(
            seed=seed,
            **agent,
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
    shaped = None
    if args.search_shape is not None:
        build = partial(build_model, args.model, args.channels, args.context, args.horizon, seed=0)
        shaped = search_shape(args.search_shape, size, args.budget_ratio, shape_model, build)
        if PartialState().is_main_process:
            print(f"byte search on {shaped.name}: {shaped.byte_budget:.4g} of its searched Linears' fp32 bytes")
    search = search_factory(size, args, shaped)
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
    if shaped is not None:  # its dense arm before the byte arms: greedy measures on it
        add_narrow_arm(plan, shaped.name, shaped.shape, None, size, args.model_path)
        plan.search_shape = shaped.name
        plan.shapes.update({name: shaped.shape for name in ("smartformer-bytes", *BYTE_DERIVED)})
    if args.budget_ratio is not None:
        add_byte_arms(plan, search)
    for name in args.runs or []:
        if any(entry[0] == name for entry in plan.arms):
            continue
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
            check_budget_fits(linear_slots(shape_model if shaped is None else shaped.model, config), config.byte_budget)
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
    """The ``narrow-`` arm ``name``: a fresh model of ``shape``, dense or as the named arm ``arm`` (where the shape
    says so, its later layers share the first's Linears: dense, or an ``ends-`` arm)."""
    narrower(size, shape)  # refuses a shape the model cannot take, before any arm trains
    if path is not None:
        raise ValueError(f"--runs {name} trains a fresh narrower model; it cannot start from --model-path {path}")
    shared = shape[3]
    if shared and arm is not None and ends_arm(arm) is None:
        raise ValueError(
            f"--runs {name}: -shared is dense or takes an ends- arm after it (e.g. {name[: -len(arm)]}ends-8-4)"
        )
    if shared:
        plan.arms.append((name, None, None, None))
        plan.prepares[name] = prepare_shared_dense if arm is None else prepare_ends(*ends_arm(arm), shared=True)
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
        "after the first reuse its Linears (dense or an ends- arm), dense or as that lowbit-, rows-, ends- or vq- arm; "
        "bytes against the full model's)",
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
    measured = plan.search_shape or "dense"
    if "greedy-bytes" in runs and measured not in runs:
        raise ValueError(f"--runs {runs}: greedy-bytes measures each layer's sensitivity on the {measured} run; add it")
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
