"""Shared pytest setup: the Hub emulator fixtures (``hub``, ``repo_id``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helper modules (hub_emulator, hub_fixtures)

from hub_fixtures import hub, repo_id  # noqa: E402,F401
