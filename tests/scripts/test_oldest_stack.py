"""scripts/oldest_stack.sh runs a list of test paths under PyTorch 2.3: a path that moves or
goes away makes pytest refuse the whole run there, which no CI on today's stack would see."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_path_the_oldest_stack_runs_exists():
    script = (ROOT / "scripts" / "oldest_stack.sh").read_text()
    paths = re.findall(r"\btests/[\w/.]+", script)
    assert len(paths) > 10  # the pytest line's paths were found
    assert [p for p in paths if not (ROOT / p).exists()] == []
