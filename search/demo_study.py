"""A small synthetic study stored the way the search stores one, without running any engine:
for tests of the report and the dashboard, and for tradeoffs.ipynb when no real study exists.

The numbers are made up but shaped like CPU trials of the tiny model: the attrs keys, the
constraint, the parameters, the metric names and the verified best match search/optimize.py and
search/run_write.py.
"""

from __future__ import annotations

import random
from itertools import product

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from search import study as st
from search.records import geometric_mean
from variants.variant import Variant

TRACES = ("short", "long_prompt", "batched")
# Relative speed and memory of each choice (the shape of a real CPU study, not a measurement).
SPEED = {
    "cache": {"contiguous": 0.8, "slab": 1.0, "paged": 0.9},
    "attention": {"manual": 0.7, "sdpa": 1.0},
    "fuse_qkv": {True: 1.05, False: 1.0},
    "fuse_gate_up": {True: 1.03, False: 1.0},
}
MEMORY = {"contiguous": 1.6, "slab": 1.0, "paged": 0.7}


def demo_variants() -> list[Variant]:
    out = []
    for cache, attention, qkv, gate_up in product(
        ("contiguous", "slab", "paged"), ("manual", "sdpa"), (True, False), (True, False)
    ):
        out.append(Variant(cache=cache, attention=attention, fuse_qkv=qkv, fuse_gate_up=gate_up))
    return out


def _attrs(variant: Variant, rng: random.Random, ok: bool) -> tuple[dict, tuple | None]:
    v = variant.to_dict()
    attrs: dict = {
        "variant": v,
        "variant_name": variant.name,
        "status": "ok" if ok else "infeasible",
        "protocol": "quick",
        "atol": 0.01,
        "rtol": 0.01,
        "max_abs_err": 3e-4 if ok else 0.4,
        "tol_share": 0.03 if ok else 40.0,
        "constraint": [0.03 - 0.5 if ok else 40.0 - 0.5],
        "trial_seconds": round(rng.uniform(8, 20), 3),
    }
    if not ok:
        attrs["reason"] = "wrong logits: uses 40.00 of the tolerance (limit 0.5)"
        return attrs, (0.0, 0.0)
    speed = 1.0
    for axis, table in SPEED.items():
        speed *= table[v[axis]]
    tps = {}
    for i, trace in enumerate(TRACES):
        tps[trace] = (400.0 + 300 * i) * speed * rng.uniform(0.92, 1.08)
        attrs[f"tps_{trace}"] = tps[trace]
        attrs[f"decode_tps_{trace}"] = tps[trace] * 0.8
        attrs[f"seconds_{trace}"] = 64 / tps[trace]
        attrs[f"floor_eff_{trace}"] = min(0.95, 0.05 * speed * (i + 1) * rng.uniform(0.9, 1.1))
    attrs["tokens_per_s"] = geometric_mean(list(tps.values()))
    attrs["peak_mib"] = 40.0 * MEMORY[v["cache"]] * rng.uniform(0.97, 1.03)
    attrs["create_s"] = 0.2
    attrs["peak_kind"] = "rss"
    return attrs, (attrs["tokens_per_s"], attrs["peak_mib"])


def create_demo_study(url: str, name: str = "demo", seed: int = 0) -> optuna.Study:
    """A study of 24 trials (two infeasible, one failed) with a verified best, at `url`."""
    rng = random.Random(seed)
    study = st.open_study(st.open_storage(url), name, fresh=True)
    dists = {
        "cache": CategoricalDistribution(["contiguous", "slab", "paged"]),
        "attention": CategoricalDistribution(["manual", "sdpa"]),
        "fuse_qkv": CategoricalDistribution([True, False]),
        "fuse_gate_up": CategoricalDistribution([True, False]),
    }
    variants = demo_variants()
    rng.shuffle(variants)
    for number, variant in enumerate(variants):
        params = {k: getattr(variant, k) for k in dists}
        if number == 5:
            attrs = {
                "variant": variant.to_dict(),
                "variant_name": variant.name,
                "status": "failed",
                "reason": "timed out after 180 s during timing",
                "timed_out": True,
                "constraint": [1e6],
            }
            trial = optuna.trial.create_trial(
                state=TrialState.FAIL, params=params, distributions=dists, user_attrs=attrs
            )
        else:
            ok = not (
                variant.attention == "manual" and variant.cache == "contiguous" and number % 2
            )
            attrs, values = _attrs(variant, rng, ok)
            trial = optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                params=params,
                distributions=dists,
                values=list(values),
                user_attrs=attrs,
            )
        study.add_trial(trial)
    study.set_user_attr("traces", list(TRACES))
    study.set_user_attr("hardware", "cpu-demo")
    best = max(
        (t for t in study.get_trials() if t.user_attrs.get("status") == "ok"),
        key=lambda t: t.values[0],
    )
    study.set_user_attr(
        "verified_best",
        {
            "trial": best.number,
            "variant": best.user_attrs["variant"],
            "variant_name": best.user_attrs["variant_name"],
            "tokens_per_s": best.values[0],
            "peak_mib": best.values[1],
            "n_trials": len(study.get_trials()),
            "engine_sha256": "0" * 64,
            "verified_at": "2026-01-01 00:00:00",
        },
    )
    return study
