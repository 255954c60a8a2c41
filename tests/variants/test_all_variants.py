"""Every eager variant the CPU probe offers, rendered to a standalone file and loaded the way the
grader does, passes the correctness gate (public and stress cases, atol = rtol = 1e-2).

Run with -s to see each variant's tol_share (1.0 = at the tolerance). The reference's logits are
the same for every variant: the check is prepared once (`prepare_check`) and the course gate keeps
each row's reference after its first use, so every variant after the first reuses them."""

import pytest

from evaluator.correctness import check_prepared, prepare_check
from evaluator.engine_loader import load_engine_module
from evaluator.gates import CourseGate
from variants.render import render_engine


@pytest.fixture(scope="module")
def prepared(tiny_config, sharp_weights):
    return prepare_check(CourseGate(atol=1e-2, rtol=1e-2), tiny_config, sharp_weights, "cpu")


def test_every_cpu_variant_passes_check_engine(tmp_path, prepared, cpu_variant):
    module = load_engine_module(render_engine(cpu_variant, tmp_path / "engine.py"))
    results = check_prepared(module.create_engine, prepared)
    shares = {case: r["tol_share"] for case, r in results.items()}
    print(f"\n{cpu_variant.name}: tol_share {shares}")
    assert set(results) == {"public", "stress"}
    for case, r in results.items():
        assert r["passed"], f"{case}: {r['failure']}"
        assert r["steps"] > 0
        # float32 on CPU: far inside the tolerance (measured <= 5e-4 of it).
        assert r["tol_share"] < 0.01, (case, r["tol_share"])
