"""A search worker (`python -m search worker`): more trials for a study that lives in a storage.

Run one per GPU, or one per machine on a shared database; they share the study's trial target.
The model comes from the study (recorded by `run`) unless `--model-config`/`--weight-dir` say
otherwise (weights at another path on another machine). Workers never write `engine.py`: the next
`run` on the storage chooses, verifies and writes it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from search import study as st
from search.optimize import Budget, enqueue_known_good, optimize
from search.run_setup import (
    DEFAULT_TRIAL_TIMEOUT_S,
    ENGINES_ALIVE,
    measure_ceilings,
    resolve_device,
)
from search.space import SearchSpace
from search.trial import TrialRunner
from search.trial_worker import OBJECTIVE_TRACES
from variants.probe import probe_capabilities

log = logging.getLogger(__name__)


def worker(args) -> int:
    start = time.monotonic()
    storage = st.open_storage(args.storage)
    device = resolve_device(args.device)
    name = args.study
    if args.model_config:
        config = json.loads(Path(args.model_config).read_text())
    else:
        try:
            existing = st.load_study(storage, name)
        except KeyError as exc:
            raise SystemExit(
                f"error: no study {name!r} in {args.storage}; create it with "
                "`python -m search run --storage ...` or pass --model-config"
            ) from exc
        name, config = existing.study_name, existing.user_attrs.get("model_config")
        if not config:
            raise SystemExit(f"error: study {name!r} records no model config; pass --model-config")
    caps = probe_capabilities(device, config)
    study = st.open_study(storage, name or st.study_name(config, caps), seed=args.seed)
    attrs = study.user_attrs
    weight_dir = args.weight_dir or attrs.get("weight_dir")
    if not weight_dir or not (Path(weight_dir) / "model.pt").is_file():
        raise SystemExit(f"error: no model.pt in weight dir {weight_dir!r}; pass --weight-dir")
    if attrs.get("hardware") and attrs["hardware"] != st.hardware_key(caps):
        log.warning(
            "this worker runs on %s but the study measured %s: numbers will not compare",
            st.hardware_key(caps),
            attrs["hardware"],
        )
    recorded = {
        "model_config": config,
        "weight_dir": str(weight_dir),
        "hardware": st.hardware_key(caps),
    }
    for key, value in recorded.items():
        if not attrs.get(key):
            study.set_user_attr(key, value)
    space = SearchSpace(caps)
    enqueue_known_good(study, space, caps, storage, study.study_name, st.hardware_key(caps), None)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    timeout = args.trial_timeout or DEFAULT_TRIAL_TIMEOUT_S[kind]
    runner = TrialRunner(
        config,
        str(weight_dir),
        device,
        renderer=args.renderer,
        traces=tuple(attrs.get("traces") or OBJECTIVE_TRACES),
        timeout_s=timeout,
        ceilings=attrs.get("ceilings") or measure_ceilings(device),
    )
    if attrs.get("memory_budget_gib"):  # the study's, as `run` recorded it
        runner.memory_budget_mib = 1024 * attrs["memory_budget_gib"]
        runner.engine_budget_gib = attrs["memory_budget_gib"] / ENGINES_ALIVE
    minutes = args.budget_minutes or 24 * 60
    budget = Budget(start + 60 * minutes, timeout, reserve_trials=0.0)
    ran = optimize(study, space, runner, budget, n_trials=args.trials)
    log.info("worker done: %d trial(s) run here; the study now has %d", ran, len(study.trials))
    return 0
