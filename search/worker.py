"""A search worker (`python -m search worker`): more trials for a study that lives in a storage.

Run one per GPU, or one per machine on a shared database; they share the study's trial target.
The model comes from the study (recorded by `run`) unless `--model-config`/`--weight-dir` say
otherwise (weights at another path on another machine). Workers never write `engine.py`: the next
`run` on the storage chooses, verifies and writes it. A worker that dies leaves its trial
RUNNING until the next process fails it: on a database when its heartbeat stops, on a journal
file when it is older than any trial limit (`search.study.fail_stale_trials`).
"""

from __future__ import annotations

import logging
import time

import optuna

from search import study as st
from search.errors import UserError
from search.optimize import Budget, enqueue_known_good, optimize
from search.run_setup import (
    DEFAULT_TRIAL_TIMEOUT_S,
    ENGINES_ALIVE,
    choose_gate,
    measure_ceilings,
    resolve_device,
)
from search.space import SearchSpace
from search.target import resolve_target
from search.trial import TrialRunner
from search.trial_worker import OBJECTIVE_TRACES
from variants.probe import probe_capabilities

log = logging.getLogger(__name__)


def worker(args) -> int:
    start = time.monotonic()
    device = resolve_device(args.device)
    if args.study is None and not args.model_config:
        raise UserError("name the study to add trials to with --study (or give --model-config)")
    storage = st.open_storage(args.storage, heartbeat_s=args.heartbeat)
    name = args.study
    known = name is not None and name in optuna.get_all_study_names(storage)
    attrs = st.load_study(storage, name).user_attrs if known else {}
    config_path = args.model_config or attrs.get("model_config_path")
    if not config_path:
        raise UserError(f"no study {name!r} in {args.storage}: create it with `python -m "
                        "search run --storage ...`, or pass --model-config")  # fmt: skip
    target = resolve_target(config_path, args.weight_dir or attrs.get("weight_dir"))
    caps = probe_capabilities(device, target.config)
    gate_spec, _ = choose_gate(attrs.get("gate") or "auto", target)  # the study's gate
    gate = gate_spec.name
    study = st.open_study(
        storage, name or st.study_name(target.config, caps, target.fingerprint, gate),
        seed=args.seed,
    )  # fmt: skip
    attrs = study.user_attrs
    if attrs.get("weights_fingerprint") not in (None, target.fingerprint):
        raise UserError(
            f"the weights in {target.weight_dir} are not the ones study {study.study_name} "
            "measured; pass --weight-dir with that study's weights"
        )
    if attrs.get("hardware") and attrs["hardware"] != st.hardware_key(caps):
        log.warning(
            "this worker runs on %s but the study measured %s: numbers will not compare",
            st.hardware_key(caps),
            attrs["hardware"],
        )
    recorded = {
        "model_config": target.config,
        "model_config_path": str(target.config_path),
        "weight_dir": str(target.weight_dir),
        "weights_fingerprint": target.fingerprint,
        "gate": gate,
        "hardware": st.hardware_key(caps),
    }
    for key, value in recorded.items():
        if not attrs.get(key):
            study.set_user_attr(key, value)
    config, weight_dir = target.config, target.weight_dir
    space = SearchSpace(caps)
    enqueue_known_good(study, space, caps, storage, study.study_name, st.hardware_key(caps), None)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    timeout = args.trial_timeout or DEFAULT_TRIAL_TIMEOUT_S[kind]
    st.fail_stale_trials(study, older_than_s=2 * timeout + 120)  # a dead worker's trials
    runner = TrialRunner(
        config,
        str(weight_dir),
        device,
        renderer=args.renderer,
        traces=tuple(attrs.get("traces") or OBJECTIVE_TRACES),
        timeout_s=timeout,
        ceilings=attrs.get("ceilings") or measure_ceilings(device),
        gate=gate_spec.to_dict(),
    )
    if attrs.get("memory_budget_gib"):  # the study's, as `run` recorded it
        runner.memory_budget_mib = 1024 * attrs["memory_budget_gib"]
        runner.engine_budget_gib = attrs["memory_budget_gib"] / ENGINES_ALIVE
    minutes = args.budget_minutes or 24 * 60
    budget = Budget(start + 60 * minutes, timeout, reserve_trials=0.0)
    ran = optimize(study, space, runner, budget, n_trials=args.trials)
    log.info("worker done: %d trial(s) run here; the study now has %d", ran, len(study.trials))
    return 0
