"""The journey tier: the documented flows run as users run them, every step in a new process.

A checkpoint of every method and storage option (``journey_steps.CASES``) is saved by one process of the full
environment; other processes then load it natively (base class, ``AutoModel``, task Auto class) in the full and
the minimal environment, with ``trust_remote_code`` in the bare one (torch + transformers + safetensors; plus torchao
for a checkpoint whose Linears torchao quantized), compress a dense checkpoint while loading, run the CLI's
``report``, and push to the Hub emulator for a bare environment to load from there. Outputs must equal the saved
model's. The README's and the docs' python blocks run as scripts, one process each, in reading order.
Environments: ``journey_envs.py`` (built once, cached). ``make test-journeys`` runs this tier; ``.ci/run`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import ROOT, chains, python_blocks
from journey_steps import CASES
from run_once import once

pytestmark = pytest.mark.journey

STEPS = Path(__file__).with_name("journey_steps.py")
#: Cases whose Linear weights torchao quantized: they need torchao where they load, and compress-on-load does not
#: apply (one quantization_config per from_pretrained call: compress, then quantize_linears).
TORCHAO = {name for name, case in CASES.items() if case.get("torchao")}
NEEDS_TORCHAO = "pip install torchao"


@pytest.fixture(scope="session")
def saved(run_folder):
    """``saved(case)``: the folder where one full-environment process saved every case (at the first call of the
    run, whichever xdist worker makes it)."""
    root = run_folder / "journeys"

    def save() -> str:
        root.mkdir(exist_ok=True)
        step(Path(sys.executable), "save", ",".join(sorted(CASES)), root)
        return str(root)

    def folder(name: str) -> Path:
        return Path(once(run_folder, "journey-checkpoints", save)) / name

    return folder


def step(python: Path, *arguments, env: dict | None = None, expect_error: str | None = None) -> str:
    """Run one journey step in a new process of ``python``, from a folder outside the repository; returns its
    output. With ``expect_error``, the step must fail with that text in its last lines (and not by a signal)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.setdefault("HF_HUB_OFFLINE", "1")
    environment.update(env or {})
    result = subprocess.run(
        [str(python), str(STEPS), *map(str, arguments)],
        cwd=arguments[2],  # the case's folder (or all cases' folder): outside the repository, as a user's script runs
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = result.stderr[-3000:]
    assert result.returncode >= 0, f"the step was killed by signal {-result.returncode}:\n{tail}"
    if expect_error is not None:
        assert result.returncode != 0 and expect_error in tail, tail
        return tail
    assert result.returncode == 0, tail
    return result.stdout


def loaded_lines(output: str) -> list[str]:
    return json.loads(output.strip().splitlines()[-1])["loaded"]


@pytest.mark.parametrize("environment", ["full", "minimal"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_checkpoint_loads_natively_in_a_new_process(case, environment, journey_envs, saved):
    folder = saved(case)
    if case in TORCHAO and environment == "minimal":  # the library without its quant extra
        step(journey_envs[environment], "native", case, folder, expect_error=NEEDS_TORCHAO)
        return
    lines = loaded_lines(step(journey_envs[environment], "native", case, folder))
    classes = 2 if CASES[case]["family"] == "patchtst" or case in TORCHAO else 3
    assert len(lines) == classes and all(line.endswith("equal") for line in lines), lines


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_checkpoint_loads_with_remote_code_where_only_torch_and_transformers_are(case, journey_envs, saved):
    folder = saved(case)
    if case in TORCHAO:
        step(journey_envs["bare"], "remote", case, folder, expect_error=NEEDS_TORCHAO)
        lines = loaded_lines(step(journey_envs["bare_torchao"], "remote", case, folder))
    else:
        lines = loaded_lines(step(journey_envs["bare"], "remote", case, folder))
    assert lines and all("trust_remote_code=True" in line and line.endswith("equal") for line in lines), lines


@pytest.mark.parametrize("case", sorted(set(CASES) - TORCHAO))
def test_compress_on_load_gives_the_saved_model(case, journey_envs, saved):
    lines = loaded_lines(step(journey_envs["full"], "compress-on-load", case, saved(case)))
    assert len(lines) == 1 and lines[0].endswith("equal"), lines


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_reports_a_saved_checkpoint(case, journey_envs, saved):
    cli = journey_envs["full"].with_name("hf-tensorcompress")
    result = subprocess.run(
        [str(cli), "report", str(saved(case) / "compressed")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert CASES[case]["config"]["method"] in result.stdout, result.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_pushed_with_the_cli_then_loaded_from_the_hub_where_only_torch_and_transformers_are(
    case, journey_envs, saved, hub, repo_id
):
    """The Hub checks the imports of every shipped file (a local folder: only the entry point's)."""
    cli = journey_envs["full"].with_name("hf-tensorcompress")
    pushed = subprocess.run(
        [str(cli), "push", str(saved(case) / "compressed"), repo_id], capture_output=True, text=True, timeout=300
    )
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    hub_env = {"HF_HUB_OFFLINE": "0", "HF_MODULES_CACHE": str(saved(case) / "modules")}
    python = journey_envs["bare_torchao" if case in TORCHAO else "bare"]
    lines = loaded_lines(step(python, "remote", case, saved(case), repo_id, env=hub_env))
    assert lines and all(line.endswith("equal") for line in lines), lines


DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            path, id=str(path.relative_to(ROOT)), marks=[pytest.mark.slow, pytest.mark.timeout(3600)] if slow else []
        )
        for path in DOC_FILES
        for slow in (False, True)
        if any(slow == any("slow" in b.flags for b in group) for group in chains(python_blocks(path)))
    ],
)
def test_the_docs_python_blocks_run_as_scripts_in_reading_order(path, request, tmp_path):
    """Each chain of blocks (``doc_blocks.py``) is one script in its own process; a page's scripts share a folder,
    so a later block can load what an earlier one saved, as a reader following the page would."""
    slow = "slow" in request.node.keywords
    groups = [g for g in chains(python_blocks(path)) if slow == any("slow" in b.flags for b in g)]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for number, group in enumerate(groups):
        code = "\n".join(block.code for block in group)
        if any("hub" in block.flags for block in group):
            hub = request.getfixturevalue("hub")
            code = code.replace('"me/', f'"{hub.USER}/')
            env.update({key: os.environ[key] for key in ("HF_ENDPOINT", "HF_TOKEN", "HF_HOME") if key in os.environ})
            env.update(HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")
        script = tmp_path / f"block_{number}.py"
        script.write_text(code, encoding="utf-8")
        result = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600
        )
        assert result.returncode == 0, f"{group[0].where}:\n{result.stderr[-3000:]}"


def test_a_4bit_checkpoint_names_every_package_the_bare_environment_lacks(journey_envs, tmp_path):
    """Where only torch and transformers are, a checkpoint with NF4 Linears asked for bitsandbytes, then (once
    installed) for accelerate: one message names both."""
    from test_stacked_bnb import stacked

    stacked().save_pretrained(tmp_path / "nf4")
    script = "import sys\nfrom transformers import AutoModelForCausalLM\n"
    script += "AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(journey_envs["bare"]), "-c", script, str(tmp_path / "nf4")],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "pip install bitsandbytes accelerate" in result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
