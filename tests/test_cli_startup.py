"""The command line as a newcomer meets it: fast ``--help`` (no model or data code), ``python -m hf_tensorcompress``, list flags
written any of three ways, and optional extras that fail with a message naming the extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tensorcompress.cli import build_parser, compression_config, exit_code
from hf_tensorcompress.cli.common import UsageError
from hf_tensorcompress.core.extras import MissingExtraError, require

ROOT = Path(__file__).resolve().parents[1]
#: What --help must not load: torch, transformers, the model code, the data and evaluation stacks.
HEAVY = ("torch", "transformers", "tensorly", "datasets", "evaluate", "accelerate", "peft")


def python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_help_and_argument_errors_do_not_import_model_or_data_code():
    result = python(
        "import sys\n"
        "from hf_tensorcompress.cli import main\n"
        "for argv in (['--help'], ['compress', '--help'], ['report', '--help'], ['compress'], ['nonsense'],\n"
        "             ['compress', 'a', 'b', '--no-such-flag']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code in (0, 2), exit.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_python_dash_m_runs_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "hf_tensorcompress", "--help"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "usage: hf-tensorcompress" in result.stdout
    for command in ("fetch", "compress", "evaluate", "report", "push"):
        assert command in result.stdout


def test_a_config_imports_its_own_method_config_only():
    result = python(
        "import sys, hf_tensorcompress\n"
        "config = hf_tensorcompress.CompressionConfig(method='cp', rank=0.5)\n"
        "print(type(config).__name__)\n"
        "print(sorted(m for m in sys.modules if m.startswith('hf_tensorcompress.methods.') and m.count('.') > 2))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["CPConfig", "['hf_tensorcompress.methods.cp.config']", "[]"]


def test_import_of_the_package_is_lazy_but_complete():
    result = python(
        "import sys, hf_tensorcompress as h\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "missing = [name for name in h.__all__ if getattr(h, name, None) is None]\n"
        "print(missing)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "[]"]


def config_from(*argv: str):
    return compression_config(build_parser().parse_args(["compress", "in", "out", *argv]))


@pytest.mark.parametrize("shape", [["8,8,9"], ["8", "8", "9"], ["[8, 8, 9]"], ["8,8", "9"]])
def test_list_flags_accept_spaces_commas_and_json(shape):
    config = config_from("--method", "tt", "--tt-shape", *shape, "--tt-ranks", "5,5")
    assert config.tt_shape == [8, 8, 9] and config.tt_ranks == [5, 5]


def test_list_flags_keep_scalars_and_regexes_where_the_field_takes_them():
    assert config_from("--method", "tt", "--tt-shape", "8", "8", "9", "--tt-ranks", "5").tt_ranks == 5
    assert config_from("--target-modules", "q_proj").target_modules == ["q_proj"]
    for names in (["q_proj", "k_proj"], ["q_proj,k_proj"], ['["q_proj", "k_proj"]']):
        assert config_from("--method", "svd", "--target-modules", *names).target_modules == ["q_proj", "k_proj"]
    assert config_from("--target-modules", r".*\.(q|k)_proj").target_modules == r".*\.(q|k)_proj"
    assert config_from("--method", "biprop", "--attention-modules", "a,b").attention_modules == ["a", "b"]


def test_an_option_of_another_method_is_an_error_naming_its_config():
    with pytest.raises(ValueError, match="TTConfig"):
        config_from("--method", "cp", "--tt-shape", "8,8,9")


def test_missing_extra_names_the_extra(monkeypatch):
    for name in ("aeon", "aeon.datasets"):  # import fails as if aeon were not installed (even after another test's)
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(
        MissingExtraError, match=r'pip install aeon \(in a clone of hf_tensorcompress: pip install -e "\.\[sbt\]"'
    ):
        require("aeon.datasets", "the UEA classification data")
    assert exit_code(MissingExtraError("x")) == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    from hf_tensorcompress.search.plot import plot_trace

    with pytest.raises(MissingExtraError, match=r"\[plots\]"):
        plot_trace([], "trace.png")


def test_wrong_flag_values_are_refused_before_torch_loads(tmp_path):
    """Each took 17-19 s to be refused, torch and the model code imported first: now one error line, exit 2, and
    nothing heavy imported (so well under a second)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ["compress", str(tmp_path / "missing"), str(tmp_path / "out"), "--rank", "0.5"],
        ["compress", str(empty), str(tmp_path / "out"), "--method", "svd", "--rank", "2.5"],
        ["compress", str(empty), str(tmp_path / "out")],  # no config.json, no .gguf
        ["report", str(tmp_path / "missing")],
        ["report", str(empty), "--tokens", "0"],
        ["evaluate", str(empty), "--stride", "0"],
        ["evaluate", str(empty), "--split", "testing"],
        ["evaluate", str(tmp_path / "missing")],
        ["export-onnx", str(empty), "o.onnx", "--accuracy-level", "9"],
        ["export-onnx", str(empty), "o.onnx", "--standard-ops", "--accuracy-level", "4"],
        ["push", str(tmp_path / "missing"), "me/model"],
    ]
    result = python(
        "import json, sys\n"
        "from hf_tensorcompress.cli import main\n"
        "codes = []\n"
        f"for argv in {cases!r}:\n"
        "    try:\n"
        "        codes.append(main(argv))\n"
        "    except SystemExit as exit:\n"
        "        codes.append(exit.code)\n"
        f"print(json.dumps([codes, sorted(m for m in {HEAVY + ('pandas',)!r} if m in sys.modules)]))\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    codes, imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert codes == [2] * len(cases) and imported == [], (codes, imported, result.stderr[-3000:])
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == len(cases), result.stderr


def test_an_unknown_flag_is_reported_with_the_subcommands_usage():
    result = python("from hf_tensorcompress.cli import main\nmain(['report', 'folder', '--no-such-flag'])")
    assert result.returncode == 2
    assert "usage: hf-tensorcompress report [-h]" in result.stderr and "--tokens" in result.stderr
    assert "hf-tensorcompress report: error: unrecognized arguments: --no-such-flag" in result.stderr


def test_a_folder_holding_one_gguf_file_is_compressed_from_that_file(tmp_path, capsys):
    """``fetch smollm2`` prints a folder holding one .gguf file; compress refused it without naming the file."""
    from hf_tensorcompress.cli.compress import model_source

    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    assert model_source(str(tmp_path)) == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "compressing SmolLM2-135M-Instruct.Q4_1.gguf" in capsys.readouterr().err
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(UsageError, match=r"holds 2 GGUF files \(SmolLM2-135M-Instruct.Q4_1.gguf, other.gguf\)"):
        model_source(str(tmp_path))
