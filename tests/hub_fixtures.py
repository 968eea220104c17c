"""Pytest fixtures pointing ``huggingface_hub`` (in this process and in subprocesses) at the Hub emulator."""

from __future__ import annotations

import importlib

import pytest
from hub_emulator import HubEmulator


def _reload_hub_constants() -> None:
    """``huggingface_hub.constants`` reads HF_ENDPOINT/HF_HOME/... at import; re-read them after the env changed."""
    import huggingface_hub.constants
    import transformers.utils.hub

    importlib.reload(huggingface_hub.constants)
    transformers.utils.hub._hf_api = None  # transformers' shared HfApi captured the old endpoint


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A running emulator; HF_ENDPOINT, HF_TOKEN, HF_HUB_DISABLE_XET=1 and an isolated HF_HOME are set meanwhile.

    Module-scoped, so tests in other modules never see the patched environment.
    """
    home = tmp_path_factory.mktemp("hf_home")
    with HubEmulator() as emulator, pytest.MonkeyPatch.context() as patch:
        for name in ("TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN_PATH", "HF_MODULES_CACHE"):
            patch.delenv(name, raising=False)
        patch.setenv("HF_HUB_OFFLINE", "0")  # explicit: helpers.run_without_library defaults subprocesses to offline
        patch.setenv("HF_ENDPOINT", emulator.endpoint)
        patch.setenv("HF_TOKEN", emulator.TOKEN)
        patch.setenv("HF_HUB_DISABLE_XET", "1")
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        _reload_hub_constants()
        try:
            yield emulator
        finally:
            patch.undo()
            _reload_hub_constants()


@pytest.fixture
def repo_id(hub, request) -> str:
    """A fresh repo name in the token owner's namespace (created by the push under test)."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:80]
    return f"{hub.USER}/{name}"
