import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hub_fixtures import hub, repo_id  # noqa: E402,F401  (the Hub emulator fixtures)
