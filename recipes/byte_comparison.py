"""The byte search against what a user would pick instead, at equal bytes, on several data sets and seeds: one command
for the results page's table and figure.

    python recipes/byte_comparison.py --device cuda --seeds 0 1 2 --output-dir byte-comparison
    python recipes/byte_comparison.py --device cpu --size demo --context 96 --steps 30 --seeds 0 \
        --datasets appliances_energy --output-dir smoke        # a smoke run (minutes on 2 CPU cores)
    python recipes/byte_comparison.py --merge part-a part-b --output-dir byte-comparison  # runs split over processes

Per data set it runs ``recipes/smartformer.py`` (PatchTST, every arm for the same steps, data and model selection)
with ``--budget-ratio``: dense; int8/int4 PTQ and ternary/int4/int2 QAT of every Linear; ``smartformer-bytes`` (the
RL search over rank and factor width of every Linear); one rank and width everywhere, random allocations and a greedy
sensitivity allocation at the bytes the search ended with; and the naive forecasts on the same test windows. With
``--choose-on-validation A B`` the arm ``chosen-on-validation`` is, per seed, whichever of A and B validated better
(scored on the test windows; the training of both is its cost). Merged runs of several learning rates (``LRS`` of
``byte_table_cpu.sh``) keep, per arm and seed, the rate of least validation MSE. Writes
``<dataset>/`` (the recipe's own output), ``comparison.json``, ``comparison.md`` (mean, median, sample std and
per-seed MSE per arm, the targets of the byte search checked) and ``comparison.png`` (test MSE against bytes of
every Linear, the quantization baselines' front marked) into ``--output-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from recipekit.arm_names import NAMED_ARM, NAMED_ARM_FORMS

RUNS = (
    "dense",
    "ptq-int8-all",
    "ptq-int4-all",
    "qat-ternary-all",
    "qat-int4-all",
    "qat-int2-all",
    "smartformer-bytes",
    "uniform-lowbit-bytes",
    "uniform-svd-bytes",
    "uniform-biprop-bytes",
    "random-bytes",
    "greedy-bytes",
    "searched-bytes",
)

#: The arm ``--choose-on-validation`` adds.
CHOSEN = "chosen-on-validation"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["electricity", "appliances_energy"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", default="medium", help="the recipe's --size")
    parser.add_argument("--context", type=int, default=336)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps of every arm")
    parser.add_argument("--budget-ratio", default="1/16", help="the byte search's budget (fraction of fp32)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="training batch of every arm (the recipe's default)"
    )
    parser.add_argument("--train-stride", type=int, default=None, help="steps between training windows (the recipe's)")
    parser.add_argument(
        "--season",
        type=int,
        nargs="+",
        default=None,
        help="season lengths of the naive forecasts (default: a day and a week)",
    )
    parser.add_argument(
        "--factor-widths",
        nargs="+",
        default=None,
        metavar="WIDTH",
        help="factor widths the search and the random and greedy allocations choose among: 16 8 4 3 2 ternary or a "
        "subset (default: the recipe's, all of them)",
    )
    parser.add_argument("--random-draws", type=int, default=3, help="random allocations per seed (random-bytes)")
    parser.add_argument(
        "--runs",
        nargs="+",
        default=list(RUNS),
        type=run_name,
        help=f"only these arms ({', '.join(RUNS)}, lowbit-2-g64, rows-4-0.045, vq-4-6 …)",
    )
    parser.add_argument("--forms", nargs="+", default=None, help="the forms the byte search offers (the recipe's)")
    parser.add_argument("--weight-group-sizes", nargs="+", default=None, help="the lowbit form's group sizes")
    parser.add_argument("--weight-scales", nargs="+", default=None, help="the lowbit form's scales (the recipe's)")
    parser.add_argument("--input-rotations", nargs="+", default=None, help="the lowbit form's rotations (the recipe's)")
    parser.add_argument("--bias-dtype", default=None, help="the lowbit form's bias (the recipe's)")
    parser.add_argument("--keep-ratios", nargs="+", default=None, help="the biprop form's keep ratios")
    parser.add_argument("--max-candidates", type=int, default=None, help="ranks of the svd and cp forms")
    parser.add_argument("--byte-reward", default=None, help="the byte search's reward (the recipe's --byte-reward)")
    parser.add_argument("--front-only", action="store_true", help="the byte search on Pareto fronts (the recipe's)")
    parser.add_argument("--share-by", default=None, help="what the byte search's budget is shared by (the recipe's)")
    parser.add_argument("--reward-baseline", default=None, help="the byte search's reward baseline (the recipe's)")
    parser.add_argument("--pace", default=None, help="the byte search's pace around each share (the recipe's)")
    parser.add_argument("--search-shape", default=None, help="the byte search's narrower model (the recipe's)")
    parser.add_argument("--search-start", default=None, help="the byte search's first form (the recipe's)")
    parser.add_argument("--search-warmup", default=None, help="steps before the byte search acts (the recipe's)")
    parser.add_argument("--search-episodes", default=None, help="the byte search's passes (the recipe's)")
    parser.add_argument("--distill", default=None, help="every arm distilled from the dense run (the recipe's)")
    parser.add_argument("--weight-average", default=None, help="every arm's weights averaged (the recipe's)")
    parser.add_argument("--learning-rate", type=float, default=None, help="every arm's learning rate (the recipe's)")
    parser.add_argument("--patch", nargs=2, default=None, help="PatchTST's patch length and stride (the recipe's)")
    parser.add_argument("--search-schedule", nargs=3, default=None, help="the searches' schedule (the recipe's)")
    parser.add_argument("--search-epsilon", nargs=3, default=None, help="the searches' exploration (the recipe's)")
    parser.add_argument("--search-agent-lr", default=None, help="the searches' agent learning rate (the recipe's)")
    parser.add_argument("--search-policy", default=None, help="the searches' agent policy (the recipe's)")
    parser.add_argument("--search-replay", default=None, help="the searches' agent replay epochs (the recipe's)")
    parser.add_argument(
        "--choose-on-validation",
        nargs="+",
        default=None,
        metavar="ARM",
        type=run_name,
        help=f"add the arm {CHOSEN!r}: per seed, whichever of these arms (two or more of --runs) has the least "
        "validation MSE, scored on the test windows (the choice a user makes between trained models)",
    )
    parser.add_argument(
        "--data", nargs=argparse.REMAINDER, default=[], help="data flags passed to the recipe as they are (last)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="FOLDER",
        help="train nothing: merge the --output-dir folders of earlier runs (other seeds, arms or learning rates of the "
        "same settings, e.g. split over processes) into one table and figure; of several learning rates, each arm and "
        "seed keeps the one of least validation MSE",
    )
    parser.add_argument("--output-dir", default="byte-comparison")
    args = parser.parse_args(argv)
    if args.choose_on_validation is not None:
        choose = args.choose_on_validation
        if len(set(choose)) < 2:
            parser.error(f"--choose-on-validation: name two or more arms to choose between, not {choose}")
        if "random-bytes" in choose:
            parser.error("--choose-on-validation: random-bytes trains several draws a seed; name one-model arms")
        missing = [] if args.merge else [arm for arm in choose if arm not in args.runs]
        if missing:
            parser.error(f"--choose-on-validation: {missing} not in --runs {args.runs}: add them there")
    folders = [dataset_folder(dataset) for dataset in args.datasets]
    shared = sorted({folder for folder in folders if folders.count(folder) > 1})
    if shared:
        parser.error(f"--datasets: several data sets would write to the same folder {shared}; rename the files apart")
    return args


def run_name(text: str) -> str:
    if text in RUNS or NAMED_ARM.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose among {', '.join(RUNS)}, {NAMED_ARM_FORMS}")


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per arm: mean, median, sample std (ddof=1) and per-seed test MSE, and the mean bytes of every Linear."""
    arms: dict[str, dict] = {}
    for run in runs:
        arm = arms.setdefault(run["name"], {"mse": [], "bytes": [], "seeds": [], "chosen": [], "rates": []})
        arm["mse"].append(run["metrics"]["mse"])
        arm["seeds"].append(run["seed"])
        arm["bytes"].append(run["linear_bytes"]["disk_ratio"])
        arm["rates"].append(run.get("learning_rate"))
        if "chosen" in run:
            arm["chosen"].append(run["chosen"])
    return {
        name: {
            "mean": statistics.mean(arm["mse"]),
            "median": statistics.median(arm["mse"]),
            "std": statistics.stdev(arm["mse"]) if len(arm["mse"]) > 1 else 0.0,
            "per_seed": arm["mse"],
            "seeds": arm["seeds"],
            "bytes": statistics.mean(arm["bytes"]),
            **({"chosen": arm["chosen"]} if arm["chosen"] else {}),
            **({"learning_rates": arm["rates"]} if None not in arm["rates"] else {}),
        }
        for name, arm in arms.items()
    }


def best_learning_rates(runs: list[dict], rates: list[float]) -> list[dict]:
    """Per (arm, seed) trained at every learning rate of ``rates``: the run of least validation MSE, the sweep a user
    runs on their own data (the test windows take no part). Every arm gets the same sweep, or the merge is refused."""
    if any(run["name"] == "random-bytes" for run in runs):
        raise ValueError("a learning-rate sweep of random-bytes (several draws a seed) has no one run to keep: drop it")
    by_arm: dict[tuple[str, int], dict[float, dict]] = {}
    for run in runs:
        by_arm.setdefault((run["name"], run["seed"]), {})[run["learning_rate"]] = run
    kept = []
    for (name, seed), swept in sorted(by_arm.items()):
        missing = [rate for rate in rates if rate not in swept]
        if missing:
            raise ValueError(
                f"{name} (seed {seed}) has no run at learning rate {missing} of the sweep {rates}: every arm needs "
                "every rate, or the one with more tries is favoured; run them or merge without those folders"
            )
        kept.append(least_validated(swept, f"{name} (seed {seed}) at learning rate"))
    return kept


def least_validated(candidates: dict, label: str) -> dict:
    """The run of least validation MSE among ``candidates``, refused where one trained without model selection."""
    unselected = [key for key, run in candidates.items() if run.get("validation_mse") is None]
    if unselected:
        raise ValueError(
            f"{label} {unselected} recorded no validation MSE (trained with --keep-last?): rerun with model selection"
        )
    return min(candidates.values(), key=lambda run: run["validation_mse"])


def chosen_on_validation(runs: list[dict], choose: list[str]) -> list[dict]:
    """Per seed that every arm of ``choose`` ran: the run of least validation MSE, as the arm ``CHOSEN`` (its test
    MSE and bytes, ``chosen``: which arm it is, ``train_seconds``: the training of every arm it chose between)."""
    by_seed: dict[int, dict[str, dict]] = {}
    for run in runs:
        if run["name"] in choose:
            by_seed.setdefault(run["seed"], {}).setdefault(run["name"], run)
    chosen = []
    for seed, candidates in sorted(by_seed.items()):
        if len(candidates) < len(set(choose)):
            continue
        best = least_validated(candidates, f"--choose-on-validation (seed {seed}):")
        seconds = sum(run.get("train_seconds", 0.0) for run in candidates.values())
        chosen.append({**best, "name": CHOSEN, "chosen": best["name"], "train_seconds": seconds})
    return chosen


def tolerance_of(budget: float) -> float:
    """How close to dense the targets ask for: within 1 % at 1/16 (and above 1/24), 3 % at 1/32."""
    return 0.01 if budget > 1 / 24 else 0.03


def targets(arms: dict[str, dict], budget: float) -> list[str]:
    """The byte search's targets, each with the numbers that decide it."""
    if "smartformer-bytes" not in arms or "dense" not in arms:
        return []
    searched, dense = arms["smartformer-bytes"], arms["dense"]
    if searched["bytes"] > budget * 1.001:
        return [
            f"smartformer-bytes holds {searched['bytes']:.4f}× of the fp32 bytes, over its budget {budget:.4f}×: its "
            "search did not decide every layer within the steps (train longer); no target is met"
        ]
    tolerance = tolerance_of(budget)
    lines = []
    for stat in ("mean", "median"):
        change = searched[stat] / dense[stat] - 1
        lines.append(
            f"smartformer-bytes at {searched['bytes']:.4f}× (budget {budget:.4f}×): {stat} MSE {searched[stat]:.4f} vs "
            f"dense {dense[stat]:.4f} ({100 * change:+.2f} %; target within {100 * tolerance:.0f} %): "
            + ("met" if change <= tolerance else "not met")
        )
    others = [name for name in arms if name.startswith("uniform-") or name in ("greedy-bytes", "random-bytes")]
    if budget > 1 / 24:  # at 1/16 also no worse than int2 QAT of every Linear (at its own 1/10)
        others.insert(0, "qat-int2-all")
    for other in others:
        if other in arms:
            better = all(searched[stat] <= arms[other][stat] for stat in ("mean", "median"))
            lines.append(
                f"vs {other} ({arms[other]['bytes']:.4f}×, mean {arms[other]['mean']:.4f}, median "
                f"{arms[other]['median']:.4f}): searched no worse on mean and median: {'yes' if better else 'no'}"
            )
    return lines


def against_naive(arms: dict[str, dict], naive: dict[str, dict]) -> list[str]:
    """Whether dense beats the best naive forecast on the test windows (a comparison says little where it does not)."""
    if "dense" not in arms or not naive:
        return []
    name, best = min(((name, value["mse"]) for name, value in naive.items()), key=lambda item: item[1])
    dense = arms["dense"]["mean"]
    return [
        f"dense {dense:.4f} vs the best naive forecast ({name}) {best:.4f}: dense "
        + (
            f"better by {100 * (1 - dense / best):.1f} %"
            if dense < best
            else f"worse by {100 * (dense / best - 1):.1f} %"
        )
    ]


def choice_lines(arms: dict[str, dict], budget: float) -> list[str]:
    """What the arm ``CHOSEN`` chose per seed, and how far it is from dense (the byte search's tolerance)."""
    if CHOSEN not in arms:
        return []
    arm = arms[CHOSEN]
    picks = ", ".join(f"{name} (seed {seed})" for name, seed in zip(arm["chosen"], arm["seeds"]))
    lines = [f"{CHOSEN} at {arm['bytes']:.4f}× chose {picks}"]
    if "dense" in arms:
        tolerance = tolerance_of(budget)
        changes = [f"{stat} {100 * (arm[stat] / arms['dense'][stat] - 1):+.2f} %" for stat in ("mean", "median")]
        lines.append(f"{CHOSEN} vs dense: {', '.join(changes)} (target within {100 * tolerance:.0f} %)")
    return lines


def learning_rate_lines(result: dict) -> list[str]:
    """Per arm, the learning rate each seed kept on validation, where the runs swept several."""
    if "learning_rates_swept" not in result:
        return []
    swept = ", ".join(f"{rate:g}" for rate in result["learning_rates_swept"])
    kept = "; ".join(
        f"{name} " + ", ".join(f"{rate:g}" for rate in arm["learning_rates"]) for name, arm in result["arms"].items()
    )
    return [f"learning rate kept on validation per seed, of {swept}: {kept}"]


def seeds_of(arms: dict[str, dict]) -> list[int]:
    """Every seed any arm of one data set ran with."""
    return sorted({seed for arm in arms.values() for seed in arm["seeds"]})


def markdown(results: dict[str, dict], budget: float) -> str:
    """Per data set: the arms by bytes (random-bytes: every draw of every seed), the naive forecasts, the targets."""
    parts = []
    for dataset, result in results.items():
        arms = result["arms"]
        rows = [
            f"| {name} | {arm['bytes']:.4f}× | {arm['mean']:.4f} ± {arm['std']:.4f} | {arm['median']:.4f} | "
            + ", ".join(f"{value:.4f}" for value in arm["per_seed"])
            + " |"
            for name, arm in sorted(arms.items(), key=lambda item: -item[1]["bytes"])
        ]
        naive = [f"| naive: {name} | - | {value['mse']:.4f} | - | - |" for name, value in result["naive"].items()]
        parts.append(
            f"### {dataset} (test MSE, mean ± std over {len(seeds_of(arms))} seeds: sample std, ddof=1; {result.get('steps')} steps "
            f"of batch {result.get('batch_size')}, training windows every {result.get('train_stride')} steps)\n\n"
            "| arm | bytes of every Linear (/ fp32) | MSE | median | per seed |\n|---|---|---|---|---|\n"
            + "\n".join(rows + naive)
            + "\n\n"
            + "\n".join(
                f"- {line}"
                for line in against_naive(arms, result["naive"])
                + targets(arms, budget)
                + choice_lines(arms, budget)
                + learning_rate_lines(result)
            )
            + "\n"
        )
    return "\n".join(parts)


def figure(results: dict[str, dict], path: str) -> None:
    """Test MSE against bytes of every Linear per data set; the quantization baselines' front drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axis, (dataset, result) in zip(axes[0], results.items()):
        arms = result["arms"]
        for name, arm in arms.items():
            marker = "*" if name == "smartformer-bytes" else ("s" if name.startswith(("ptq-", "qat-")) else "o")
            axis.errorbar(arm["bytes"], arm["mean"], yerr=arm["std"], fmt=marker, capsize=3, label=name)
        front, best = [], float("inf")
        for name, arm in sorted(arms.items(), key=lambda item: -item[1]["bytes"]):
            if name.startswith(("ptq-", "qat-")) and arm["mean"] < best:
                best = arm["mean"]
                front.append((arm["bytes"], arm["mean"]))
        if front:
            axis.step(*zip(*front), where="post", color="gray", linestyle="--", label="quantization front")
        top = 1.5 * max(arm["mean"] + arm["std"] for arm in arms.values())
        for (name, value), style in zip(result["naive"].items(), (":", "-.", (0, (1, 3)))):
            if value["mse"] <= top:  # a naive forecast far above every arm would only flatten the plot
                axis.axhline(value["mse"], linestyle=style, linewidth=0.9, color="black", label=f"naive: {name}")
        axis.set_xscale("log")
        axis.set_xlabel("bytes of every Linear (fp32 = 1)")
        axis.set_ylabel("test MSE (mean ± std over seeds)")
        axis.set_title(dataset_folder(dataset))
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merged(recipes: list[dict], choose: list[str] | None = None) -> dict:
    """One data set's results from recipe runs split over processes or machines (the same settings, other seeds or
    arms): every (arm, seed) run once, the first of duplicates kept (a dense run trained twice with one seed); with
    ``choose``, the arm ``CHOSEN`` too."""
    settings = {(r["steps"], r.get("batch_size"), r.get("train_stride"), r["budget_ratio"]) for r in recipes}
    if len(settings) > 1:
        raise ValueError(f"the runs to merge differ in (steps, batch, stride, budget): {sorted(settings, key=str)}")
    rates = {recipe.get("learning_rate") for recipe in recipes}
    if len(rates) > 1 and None in rates:
        raise ValueError("some runs to merge record no learning rate (written before it was recorded): rerun them")
    runs, seen = [], set()
    for recipe in recipes:
        for run in recipe["runs"]:
            run = {**run, "learning_rate": recipe.get("learning_rate")}
            key = (run["name"], run["seed"], run["learning_rate"])
            if run["name"] == "random-bytes" or key not in seen:  # random-bytes: every draw is its own run
                runs.append(run)
                seen.add(key)
    swept = sorted(rates) if len(rates) > 1 else None
    if swept:
        runs = best_learning_rates(runs, swept)
    if choose:
        runs += chosen_on_validation(runs, choose)
    first = recipes[0]
    return {
        "arms": summary(runs),
        **({"learning_rates_swept": swept} if swept else {}),
        "naive": first["naive"],
        "steps": first["steps"],
        "batch_size": first.get("batch_size"),
        "train_stride": first.get("train_stride"),
    }


def passed(args: argparse.Namespace) -> list[str]:
    """The byte search's and the data's flags, passed on to the recipe where given."""
    flags = []
    names = ("forms", "weight_group_sizes", "weight_scales", "input_rotations", "bias_dtype", "keep_ratios")
    names += ("max_candidates",)
    names += ("byte_reward", "reward_baseline", "share_by", "pace", "search_shape")
    names += ("learning_rate", "patch", "search_start", "search_warmup", "search_episodes", "distill")
    names += ("weight_average",)
    for name in (*names, "search_schedule", "search_epsilon", "search_agent_lr", "search_policy", "search_replay"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    return flags + (["--front-only"] if args.front_only else []) + args.data


def dataset_folder(dataset: str) -> str:
    """The subfolder of ``--output-dir`` a data set's runs write to: a built-in's name, or a file's name without its
    suffixes (a path of the user's own CSV joined as it is would point at the file itself)."""
    return os.path.basename(os.path.normpath(dataset)).split(".")[0]


def run_recipes(args: argparse.Namespace) -> dict[str, dict]:
    """Every data set through the recipe in this process (``--device``)."""
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: every run trains on the CPU
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("byte_comparison.py: error: --device cuda, but no GPU is visible; pass --device cpu")
    import smartformer

    results = {}
    for dataset in args.datasets:
        recipe = smartformer.main(
            ["--model", "patchtst", "--size", args.size, "--dataset", dataset, "--context", str(args.context),
             "--horizon", str(args.horizon), "--steps", str(args.steps), "--seeds", *map(str, args.seeds),
             "--budget-ratio", args.budget_ratio, "--random-draws", str(args.random_draws), "--runs", *args.runs,
             "--output-dir", os.path.join(args.output_dir, dataset_folder(dataset))]
            + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
            + (["--train-stride", str(args.train_stride)] if args.train_stride else [])
            + (["--season", *map(str, args.season)] if args.season else [])
            + (["--factor-widths", *args.factor_widths] if args.factor_widths else [])
            + passed(args)
        )  # fmt: skip
        results[dataset] = merged([recipe], args.choose_on_validation)
    return results


def merge_folders(folders: list[str], datasets: list[str], choose: list[str] | None = None) -> dict[str, dict]:
    """Every data set's ``results.json`` from the ``--output-dir`` folders of earlier runs, merged."""
    results = {}
    for dataset in datasets:
        paths = [os.path.join(folder, dataset_folder(dataset), "results.json") for folder in folders]
        found = [path for path in paths if os.path.exists(path)]
        if not found:
            raise SystemExit(
                f"byte_comparison.py: error: --merge: no {dataset_folder(dataset)}/results.json under {folders}"
            )
        recipes = []
        for path in found:
            with open(path, encoding="utf-8") as handle:
                recipes.append(json.load(handle))
        results[dataset] = merged(recipes, choose)
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from smartformer import fraction

    results = merge_folders(args.merge, args.datasets, args.choose_on_validation) if args.merge else run_recipes(args)
    os.makedirs(args.output_dir, exist_ok=True)
    budget = fraction(args.budget_ratio)
    seeds = {dataset: seeds_of(result["arms"]) for dataset, result in results.items()}
    with open(os.path.join(args.output_dir, "comparison.json"), "w", encoding="utf-8") as handle:
        json.dump({"budget_ratio": budget, "seeds": seeds, "results": results}, handle, indent=2)
    table = markdown(results, budget)
    with open(os.path.join(args.output_dir, "comparison.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    figure(results, os.path.join(args.output_dir, "comparison.png"))
    print(table)
    return results


if __name__ == "__main__":
    main()
