"""Hypothesis strategies for the fuzz tests: compression configs (valid and invalid, every option of every method)
and forecasting/classification tables (random column types, NaN, stray text, duplicates, unsorted time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import strategies as st

#: Values no option accepts, mixed into every field.
WRONG = st.sampled_from([None, True, -1, 0, 1.5, "bogus", [], {}, [0], float("nan")])

TARGETS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            ["q_proj"],
            ["k_proj", "v_proj"],
            ["out_proj"],
            "q_proj$",
            r".*\.v_proj",
            ["nope"],
            ["layers"],
            "(",
            "",
            [""],
            ["embed_tokens"],
            ["wte"],
            ["lm_head"],
        ]
    ),
)
RANK = st.one_of(st.integers(-1, 40), st.floats(-0.5, 1.5), WRONG)

#: Per option: a strategy drawing valid and invalid values alike.
OPTIONS: dict[str, dict[str, st.SearchStrategy]] = {
    "cp": {
        "rank": RANK,
        "ranks": st.dictionaries(st.sampled_from(["q_proj", "k_proj", "nope"]), RANK, max_size=2),
        "init": st.sampled_from(["decompose", "random", "bogus"]),
        "cp_iterations": st.one_of(st.integers(-1, 3), WRONG),
    },
    "svd": {
        "rank": RANK,
        "ranks": st.dictionaries(st.sampled_from(["q_proj", "v_proj", "nope"]), RANK, max_size=2),
        "init": st.sampled_from(["decompose", "random", "bogus"]),
    },
    "biprop": {
        "keep_ratio": st.one_of(st.floats(-0.2, 1.2), WRONG),
        "weight_init": st.sampled_from(["kaiming_normal", "signed_constant", "bogus"]),
        "weight_seed": st.one_of(st.integers(-3, 2**40), WRONG),
        "save_scores": st.one_of(st.booleans(), WRONG),
        "attention": st.sampled_from([None, "step_t", "qkv_mask", "bogus"]),
        "attention_keep_ratio": st.one_of(st.none(), st.floats(-0.2, 1.2), WRONG),
        "attention_length": st.one_of(st.none(), st.integers(-2, 60), WRONG),
        "attention_modules": st.one_of(
            st.just([]), st.sampled_from([["self_attn"], ["nope"], ["encoder.layers.0.self_attn"]]), WRONG
        ),
    },
    "tt": {
        "tt_shape": st.one_of(st.none(), st.lists(st.integers(0, 12), min_size=1, max_size=4), WRONG),
        "tt_order": st.one_of(st.none(), st.integers(0, 5), WRONG),
        "tt_ranks": st.one_of(st.none(), st.integers(0, 5), st.lists(st.integers(0, 4), max_size=3), WRONG),
        "tt_eps": st.one_of(st.none(), st.floats(-0.1, 1.1), WRONG),
        "tt_basis": st.sampled_from(["identity", "pca", "output", "bogus"]),
        "tt_solver": st.sampled_from(["auto", "eigh", "power", "bogus"]),
        "tt_exact_tokens": st.one_of(st.integers(-1, 8), WRONG),
        "tt_exact_prior": st.sampled_from(["calibration", "token_id", "mixed", "bogus"]),
        "tt_untie_output": st.one_of(st.booleans(), WRONG),
    },
    "tiered": {
        "tier_tokens": st.one_of(st.none(), st.lists(st.integers(-1, 40), max_size=3), WRONG),
        "tier_bits": st.one_of(st.none(), st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 16]), max_size=4), WRONG),
        "tier_group_size": st.one_of(
            st.none(), st.integers(-1, 30), st.lists(st.one_of(st.none(), st.integers(0, 30)), max_size=3), WRONG
        ),
        "tier_order": st.sampled_from(["token_id", "calibration", "mixed", "bogus"]),
        "rounding": st.sampled_from(["nearest", "output", "bogus"]),
        "low_rank": st.one_of(st.integers(-1, 5), WRONG),
        "low_rank_bits": st.one_of(st.sampled_from([8, 16, 4]), WRONG),
    },
}
GOOD_RANK = st.one_of(st.integers(1, 6), st.floats(0.05, 1.0))
#: Per option: a strategy drawing valid values only (for the examples meant to compress).
VALID: dict[str, dict[str, st.SearchStrategy]] = {
    "cp": {
        "rank": GOOD_RANK,
        "ranks": st.sampled_from([{}, {"q_proj": 2}]),
        "init": st.sampled_from(["decompose", "random"]),
        "cp_iterations": st.integers(1, 2),
    },
    "svd": {
        "rank": GOOD_RANK,
        "ranks": st.sampled_from([{}, {"v_proj": 0.5}]),
        "init": st.sampled_from(["decompose", "random"]),
    },
    "biprop": {
        "keep_ratio": st.floats(0.05, 1.0),
        "weight_init": st.sampled_from(["kaiming_normal", "signed_constant"]),
        "weight_seed": st.integers(0, 2**31),
        "save_scores": st.booleans(),
        "attention": st.sampled_from([None, "step_t", "qkv_mask"]),
        "attention_keep_ratio": st.one_of(st.none(), st.floats(0.05, 1.0)),
        "attention_length": st.one_of(st.none(), st.integers(1, 40)),
    },
    "tt": {
        "tt_order": st.integers(2, 3),
        "tt_ranks": st.integers(1, 4),
        "tt_eps": st.one_of(st.none(), st.floats(0.05, 0.5)),
        "tt_solver": st.sampled_from(["auto", "eigh"]),
        "tt_exact_tokens": st.integers(0, 3),
        "tt_exact_prior": st.just("token_id"),
        "tt_untie_output": st.booleans(),
    },
    "tiered": {
        "tier_group_size": st.sampled_from([None, 8, 12, 24]),
        "tier_order": st.just("token_id"),
        "rounding": st.just("nearest"),
        "low_rank": st.integers(0, 3),
        "low_rank_bits": st.sampled_from([8, 16]),
    },
}
#: Fields every config has.
COMMON = {"target_modules": TARGETS, "version": st.sampled_from([1, 2, 3, "2"])}


#: CP's decomposition takes about a second per model on two CPU cores: the fast tier draws its other inits only.
FAST_CP_INIT = st.sampled_from(["random", "bogus"])


@st.composite
def configs(draw, method: str, fast: bool = False) -> dict:
    """A config dict for ``method``: any subset of its options and the common fields, each valid or not; sometimes
    another method's option, an unknown key, or a wrong method name. Half the configs hold valid values only (meant to
    compress). ``fast``: cp never decomposes (the slow tier does)."""
    valid = draw(st.booleans())
    fields = dict(VALID[method]) if valid else {**OPTIONS[method], **COMMON}
    if fast and method == "cp":
        fields["init"] = FAST_CP_INIT if not valid else st.just("random")
    names = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    config = {"method": method, **{name: draw(fields[name]) for name in names}}
    if fast and method == "cp":
        config.setdefault("init", "random")
    if valid:
        if method == "tt":
            config.setdefault("tt_ranks", draw(VALID["tt"]["tt_ranks"]))
        if method == "tiered":  # one width per tier: tier_tokens and tier_bits are drawn together
            tokens = draw(st.lists(st.integers(1, 40), max_size=2))
            config.update(
                tier_tokens=tokens,
                tier_bits=draw(
                    st.lists(st.sampled_from([2, 3, 4, 8, 16]), min_size=len(tokens) + 1, max_size=len(tokens) + 1)
                ),
            )
        return config
    if method == "cp" and "cp_iterations" not in config:
        config["cp_iterations"] = 2  # the default (100 sweeps) is valid but slow
    extra = draw(st.sampled_from([None, "foreign", "unknown", "method"]))
    if extra == "foreign":
        other = draw(st.sampled_from(sorted(set(OPTIONS) - {method})))
        name = draw(st.sampled_from(sorted(OPTIONS[other])))
        config[name] = draw(OPTIONS[other][name])
    elif extra == "unknown":
        config["bogus_option"] = 1
    elif extra == "method":
        config["method"] = draw(st.sampled_from(["CP", "bogus", 3, None]))
    return config


CELLS = {
    "float": st.floats(-1e3, 1e3, allow_nan=False),
    "float_nan": st.one_of(st.floats(-1e3, 1e3, allow_nan=False), st.just(float("nan"))),
    "int": st.integers(-5, 5),
    "text": st.sampled_from(["a", "b", "c"]),
    "stray": st.one_of(st.floats(-10, 10, allow_nan=False), st.just("oops")),
    "bool": st.booleans(),
}


@st.composite
def tables(draw, kind: str) -> pd.DataFrame:
    """A small table: a time column (sorted, unsorted, duplicated or missing), for classification a label and a
    series id, and 1-4 value columns of random cell types. Half the tables are well formed (meant to load)."""
    valid = draw(st.booleans())
    rows = draw(st.integers(40, 80) if valid else st.integers(0, 80))
    columns: dict[str, list] = {}
    time = "sorted" if valid else draw(st.sampled_from(["sorted", "unsorted", "duplicated", "none", "text"]))
    stamps = list(pd.date_range("2024-01-01", periods=rows, freq="h").astype(str))
    if time == "unsorted":
        stamps = list(np.random.default_rng(draw(st.integers(0, 9))).permutation(stamps)) if rows else stamps
    elif time == "duplicated" and rows > 1:
        stamps[1] = stamps[0]
    elif time == "text":
        stamps = [draw(st.sampled_from(["x", "2024-01-01"])) for _ in range(rows)]
    if time != "none":
        columns["date" if kind == "forecasting" else "t"] = stamps if kind == "forecasting" else list(range(rows))
    if kind == "classification":
        series = draw(st.integers(9, 12) if valid else st.integers(1, 12))
        columns["series"] = [f"s{i % series}" for i in range(rows)]
        wrong = st.just(False) if valid else st.booleans()
        columns["label"] = [
            draw(st.sampled_from(["x", "y", None])) if draw(wrong) else f"c{i % series % 3}" for i in range(rows)
        ]
    kinds = ["float", "float_nan", "int"] if valid else sorted(CELLS)
    for index in range(draw(st.integers(1, 4))):
        cell = CELLS[draw(st.sampled_from(kinds))]
        columns[f"v{index}"] = [draw(cell) for _ in range(rows)]
    if not valid and draw(st.booleans()) and columns:
        name = draw(st.sampled_from(sorted(columns)))
        columns[f"{name}_copy"] = list(columns[name])
    return pd.DataFrame(columns)
