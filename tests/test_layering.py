"""The import-linter contracts in pyproject.toml (`lint-imports`, run by scripts/test.sh) hold on
the tree, and they have teeth: the judge importing the library it judges breaks them, and so does
an import against the layers (the library or a tool importing the search, one tool another)."""

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


def planted_tree(root: Path, module: str, planted: str) -> Path:
    """A copy of the packages in `root` whose `module` (a file path) ends with `planted`."""
    shutil.copy(REPO_ROOT / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    with open(root / module, "a") as f:
        f.write(f"\n{planted}\n")
    return root


@pytest.mark.parametrize(
    "planted",
    ["from variants.checkpoint.formats import find_weight_file", "import search.setup"],
)
def test_the_judge_importing_the_library_breaks_them(tmp_path, planted):
    proc = lint(planted_tree(tmp_path, "evaluator/floor.py", planted))
    assert proc.returncode != 0
    assert "evaluator is not allowed to import" in proc.stdout
    assert f"evaluator.floor -> {planted.split()[1]}" in proc.stdout


@pytest.mark.parametrize(
    "module,planted,importer,imported",
    [
        ("tuning/few_row.py", "import search.setup", "tuning", "search"),
        ("variants/presets.py", "from search.trial import run_child", "variants", "search"),
        ("variants/presets.py", "import tuning.few_row", "variants", "tuning"),
        ("serving/generate.py", "from search.setup import device_kind", "serving", "search"),
        ("sweep/plots.py", "import tuning.decode_attention", "sweep", "tuning"),
    ],
)
def test_an_import_against_the_layers_breaks_them(tmp_path, module, planted, importer, imported):
    proc = lint(planted_tree(tmp_path, module, planted))
    assert proc.returncode != 0
    assert "The product imports one way" in proc.stdout and "BROKEN" in proc.stdout
    assert f"{importer} is not allowed to import {imported}" in proc.stdout
    name = module.removesuffix(".py").replace("/", ".")
    assert f"{name} -> {planted.split()[1]}" in proc.stdout
