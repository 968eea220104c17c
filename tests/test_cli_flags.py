"""The command line speaks in flags: errors name ``--tier-group-size``, not ``tier_group_size``; ``--help`` lists the
allowed values of every option with a fixed set, taken from the config classes (the tuples their validation checks)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from helpers import save_word_level_lm
from test_hub_push import small_patchtst

from hf_tensorcompress.cli import build_parser, main
from hf_tensorcompress.cli.messages import flag, in_flag_terms
from hf_tensorcompress.config import config_classes

TIERED_FIELDS = ("tier_tokens", "tier_bits", "tier_group_size", "rounding", "low_rank", "low_rank_bits")


def test_fields_become_flags_and_values_are_written_as_typed():
    fields_ = ("tier_group_size", "rounding", "rank", "tt_ranks", "tt_eps", "method", "target_modules")
    cases = {
        "tier_group_size must be an int >= 1, got 0": "--tier-group-size must be an int >= 1, got 0",
        "rounding='best' is not supported": "--rounding best is not supported",
        "rank=1.5 is outside (0, 1]": "--rank 1.5 is outside (0, 1]",
        "method='tt' needs tt_ranks (max TT ranks), tt_eps (accuracy), or both": (
            "--method tt needs --tt-ranks (max TT ranks), --tt-eps (accuracy), or both"
        ),
        # plain words, paths, module names and flags stay as they are
        "the rank of /data/tt_ranks/x.json at model.rank_proj; pass --tt-ranks": (
            "the rank of /data/tt_ranks/x.json at model.rank_proj; pass --tt-ranks"
        ),
    }
    for message, expected in cases.items():
        assert in_flag_terms(message, fields_) == expected


def test_a_generic_checks_bare_name_is_the_methods_own_flag():
    message = "group_size=7 must be a positive int dividing the 32 columns"
    assert in_flag_terms(message, TIERED_FIELDS, TIERED_FIELDS).startswith("--tier-group-size 7 must")
    assert in_flag_terms(message, TIERED_FIELDS, ("factor_group_size",)).startswith("--factor-group-size 7 must")
    # none or several options end in it: left as it is
    assert in_flag_terms("bits=5 is not stored", TIERED_FIELDS, TIERED_FIELDS) == "bits=5 is not stored"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    save_word_level_lm(root / "lm", 64, 32)
    small_patchtst().save_pretrained(root / "patchtst")
    return root


def error_line(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_command_line_errors_name_flags(models, tmp_path, capsys):
    lm, out = str(models / "lm"), str(tmp_path / "out")
    line = error_line(
        capsys, "compress", lm, out, "--method", "tiered", "--tier-tokens", "16", "--tier-group-size", "7"
    )
    assert "--tier-group-size 7 must be a positive int dividing the 32 columns" in line, line
    assert "group_size=" not in line and "tier_group_size" not in line
    line = error_line(capsys, "compress", lm, out, "--method", "tiered", "--rounding", "best")
    assert "--rounding best is not supported; choose one of ['nearest', 'output']" in line, line
    line = error_line(capsys, "compress", str(models / "patchtst"), out, "--method", "tiered")
    assert "method 'tiered' compresses the token embedding" in line and "'tt'" not in line, line
    assert "pass --target-modules naming an nn.Embedding" in line


def help_of(flag_name: str) -> str:
    """The ``--help`` text of one ``compress`` flag (argparse's own rendering)."""
    compress = build_parser()._subparsers._group_actions[0].choices["compress"]
    action = next(a for a in compress._actions if flag_name in a.option_strings)
    return compress._get_formatter()._format_action(action)


def choice_fields() -> list:
    return [(cls, item) for cls in config_classes().values() for item in fields(cls) if item.metadata.get("choices")]


def test_help_lists_the_allowed_values_from_the_config_classes():
    names = {item.name for _, item in choice_fields()}
    assert {"rounding", "tier_bits", "tier_order", "codebook_size", "tt_basis", "weight_init"} <= names
    for _, item in choice_fields():
        text = " ".join(help_of(flag(item.name)).split())
        listed = text.rpartition("one of ")[2]
        assert listed.split(", ") == [str(value) for value in item.metadata["choices"]], text


def test_the_listed_values_are_the_ones_validation_accepts():
    """The help's list and the validation's cannot drift apart: a value outside is refused naming the same list."""
    for cls, item in choice_fields():
        choices = item.metadata["choices"]
        numbers = [value for value in choices if isinstance(value, int)]
        outside = max(numbers) + 1 if numbers else "not-a-choice"
        with pytest.raises(ValueError, match=r"choose one of (.*)") as refused:
            cls(**{item.name: [outside] if "list[" in str(item.type) else outside})
        assert str(list(choices)) in str(refused.value), (cls.__name__, item.name, refused.value)
