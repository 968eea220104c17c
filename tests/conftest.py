"""Fixtures every test module can use, and what makes the suite safe and quick under ``pytest -n`` (pytest-xdist,
as the Makefile's tiers run it):

- ``--dist worksteal`` gives each worker one half of the tests in file order and moves tests only when a worker runs
  out, so a module's tests mostly stay on one worker and its module-scoped fixtures are built once;
- each worker's torch (and the processes it starts) uses its share of the cores, not all of them;
- each worker has its own transformers modules cache (remote code is copied there as a checkpoint loads), so two
  workers never write the same file while a third process imports it;
- ``run_folder`` is one folder for the whole run, shared by the workers, and ``once`` builds what the run needs
  once in it (``run_once.py``: the journey environments, the journey checkpoints), whichever worker asks first.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

#: Set before transformers is imported (it reads the variable then), in every process (the xdist controller and
#: each worker) anew; removed at the end of the session.
MODULES_CACHE = tempfile.mkdtemp(prefix="hf-tensorcompress-modules-")
os.environ["HF_MODULES_CACHE"] = MODULES_CACHE

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
from hub_fixtures import hub, repo_id  # noqa: E402,F401  (the Hub emulator fixtures)
from run_once import once  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # for the processes the tests start


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(MODULES_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every xdist worker of it shares (the run's base temporary folder)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def journey_envs(run_folder: Path) -> dict[str, Path]:
    """``{name: python}`` of the journey environments (``journey_envs.py``), set up once per run."""
    from journey_envs import build_environments

    built = once(run_folder, "journey-envs", lambda: {k: str(v) for k, v in build_environments(run_folder).items()})
    return {name: Path(python) for name, python in built.items()}


@pytest.fixture(scope="session")
def onnx_runtime_python(run_folder: Path) -> Path:
    """The python of the no-torch ONNX Runtime environment (``journey_envs.py``), set up once per run."""
    from journey_envs import build_onnx_runtime_env

    return Path(once(run_folder, "onnx-runtime-env", lambda: str(build_onnx_runtime_env(run_folder))))
