"""compile_reuse.py on the CPU: a torch-only preset (no kernels to cache) through the same steps
as on the GPU: the trial's render, the written one and a sibling each pass the correctness cases
in a fresh process, and the report says so."""

import json
import sys
from pathlib import Path

from evaluator.toy_weights import save_toy_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts import compile_reuse  # noqa: E402


def test_reports_every_engine(tmp_path, tiny_config, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_config))
    save_toy_weights(tiny_config, tmp_path / "weights" / "model.pt")
    out = tmp_path / "report.json"
    code = compile_reuse.main([
        "--preset", "slab-sdpa", "--sibling", "paged-sdpa", "--device", "cpu",
        "--model-config", str(config), "--weight-dir", str(tmp_path / "weights"),
        "--cases", "public", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert [r["engine"] for r in report] == ["trial", "written", "sibling paged-sdpa"]
    for r in report:
        assert r["exit"] == 0 and r["cases"]["public"]["passed"]
        assert r["kernels_cached"] == 0  # torch only: nothing for Triton to compile
    assert "written: exit 0; public" in capsys.readouterr().out
