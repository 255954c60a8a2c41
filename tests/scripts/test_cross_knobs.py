"""scripts/cross_knobs.py's wiring on the CPU: each model's searched table, its engines with its
own table and with the other's (rendered, the other's launches on its own buckets), and the
table of the two (the searches, checks and timings, which need a GPU, are faked)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

cross = pytest.importorskip("scripts.cross_knobs")
from tuning import decode_attention as tuner  # noqa: E402
from variants.spec import ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_each_model_is_timed_with_its_own_table_and_the_others(tmp_path, monkeypatch, capsys):
    course = str(ROOT / "target" / "model_config.json")
    llama = str(ROOT / "scripts" / "gpu_models" / "llama16-bf16.json")
    speed = {"course_with_course": 1.0, "course_with_llama16": 1.2, "llama16_with_llama16": 2.0,
             "llama16_with_course": 2.5}  # fmt: skip
    tiles = {course: (32, 2, 2), llama: (64, 4, 2)}

    calls = []

    def fake_run(cmd, log, timeout_s):
        calls.append(cmd)
        if "tuning.decode_attention" in cmd:  # a table of the rules, every tile that model's
            config = cmd[cmd.index("--config") + 1]
            spec = ModelSpec.from_config(json.loads(Path(config).read_text()))
            table = {k: {**tuner.prior_launch(spec, *k, 132, (9, 0)), "tiles": tiles[config]}
                     for k in tuner.graph_buckets(spec, (9, 0))}  # fmt: skip
            out = Path(cmd[cmd.index("--json") + 1])
            out.write_text(json.dumps({"table": tuner.table_to_json(table)}))
        elif "evaluator/benchmark_throughput.py" in cmd:
            engine = Path(cmd[cmd.index("--engine") + 1])
            seconds = speed[engine.stem] * 1e-3
            Path(cmd[cmd.index("--json") + 1]).write_text(
                json.dumps({"traces": {"decode": {"seconds": seconds}}})
            )
        return 0

    monkeypatch.setattr(cross, "run", fake_run)
    argv = ["--model", f"course={course}:unused", "--model", f"llama16={llama}:unused",
            "--out", str(tmp_path)]  # fmt: skip
    assert cross.main(argv) == 0
    text = capsys.readouterr().out
    checks = [c for c in calls if "evaluator/test_correctness.py" in c]
    assert len(checks) == 4  # a bfloat16 model is checked with the gate its search picks
    assert all(c[c.index("--gate") + 1] == "auto" for c in checks)
    calls.clear()  # a second call (the device's next) reuses the tables and the timings
    assert cross.main(argv) == 0
    assert calls == [] and capsys.readouterr().out.endswith(text.split("\n\n", 1)[1])
    assert "decode                1.000      1.200       1.200" in text
    assert "decode                2.000      2.500       1.250" in text
    crossed = (tmp_path / "course_with_llama16.py").read_text()
    assert "(64, 4, 2)" in crossed and "(32, 2, 2)" not in crossed  # the other's tiles
    own = (tmp_path / "course_with_course.py").read_text()
    assert "(32, 2, 2)" in own
