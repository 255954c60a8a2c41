"""The import-linter contracts in pyproject.toml (`lint-imports`, run by scripts/test.sh) hold on
the tree, and they have teeth: the judge importing the library it judges breaks them."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evaluator", "variants", "search", "tuning", "sweep", "serving", "models")

lint_imports = shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(lint_imports is None, reason="import-linter is not installed")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [lint_imports, "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_its_contracts():
    proc = lint(REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "BROKEN" not in proc.stdout and "0 broken" in proc.stdout


@pytest.mark.parametrize(
    "planted",
    ["from variants.checkpoint.formats import find_weight_file", "import search.setup"],
)
def test_the_judge_importing_the_library_breaks_them(tmp_path, planted):
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    with open(tmp_path / "evaluator" / "floor.py", "a") as f:
        f.write(f"\n{planted}\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert "evaluator is not allowed to import" in proc.stdout
    assert f"evaluator.floor -> {planted.split()[1]}" in proc.stdout
