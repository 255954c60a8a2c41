"""The kernel search as a phase of the main job: its budget, the decision to keep a table and
what results.log says."""

import pytest

from search.kernel_phase import KernelSearch, TableSearch, decide, lines, search_budget_s
from search.setup import LEAST_S


def test_the_budget_is_a_share_of_the_run_within_what_is_left():
    assert search_budget_s(1200, 900, 300) == pytest.approx(120)  # a tenth of 20 minutes
    assert search_budget_s(7200, 7000, 300) == pytest.approx(300)  # at most five minutes
    assert search_budget_s(1200, 400, 300) == pytest.approx(100)  # what the reserve leaves
    assert search_budget_s(1200, 300 + LEAST_S / 2, 300) == 0.0  # too little to be worth it
    # from the neutral prior, every launch to find: a quarter of 20 minutes, still at most five
    assert search_budget_s(1200, 900, 300, "neutral") == pytest.approx(300)
    assert search_budget_s(600, 900, 300, "neutral") == pytest.approx(150)
    assert search_budget_s(1200, 500, 300, "neutral") == pytest.approx(200)


def searched(before, after, **kw):
    return decide(
        KernelSearch("hand", 120, table={(8, 1024): {}}, before=before, after=after, **kw)
    )


def test_a_table_is_kept_only_where_the_traces_geomean_is_faster():
    kept = searched({"decode": 5.0, "continuous": 440.0}, {"decode": 5.1, "continuous": 400.0})
    assert kept.kept and kept.gain == pytest.approx(((5.0 / 5.1) * (440 / 400)) ** 0.5)
    slower = searched({"decode": 5.0, "continuous": 440.0}, {"decode": 5.5, "continuous": 440.0})
    assert not slower.kept and "rules stay" in slower.why
    untimed = searched({"decode": 5.0}, {}, why="the gate failed")
    assert not untimed.kept and untimed.why == "the gate failed"


def test_only_traces_timed_both_ways_count():
    search = searched({"decode": 5.0}, {"decode": 4.0, "wide_decode": 200.0})
    assert search.gain == pytest.approx(1.25)


def test_only_traces_with_decode_steps_decide():
    """The table moves decode steps alone: a prefill trace's noise (5% between two timings
    of one engine on an H200) is not a verdict on it."""
    timed = {"prefill": 0.000654, "decode": 0.004911, "continuous": 0.4382}
    tuned = {"prefill": 0.000688, "decode": 0.004850, "continuous": 0.4300}
    search = searched(timed, tuned, decoding=("decode", "continuous"))
    assert search.kept and search.gain == pytest.approx(
        ((4.911 / 4.850) * (438.2 / 430.0)) ** 0.5, rel=1e-6
    )
    assert search.why.endswith("(of those with decode steps)")
    assert not searched(timed, tuned).kept  # with prefill counted, its noise decides


def test_the_log_names_what_moved_and_the_trace_times():
    search = searched({"decode": 0.005}, {"decode": 0.004})
    search.results = [
        {"rows": 8, "context": 1024, "steps": 42, "longest": 131, "prior_us": 300.0,
         "best_us": 280.0, "tried": 15, "rejected": 1, "moved": {"tiles": [32, 2, 2]}},
    ]  # fmt: skip
    text = lines(search)
    assert "8 rows x  1024" in text and "tiles=[32, 2, 2]" in text and "300.0 -> 280.0" in text
    assert (
        "decode" in text
        and "5.000" in text
        and "4.000" in text
        and text.endswith("1.250x on the traces' geometric mean")
    )
    assert lines(None).startswith("not run")


def test_a_trial_renders_the_jobs_table_only_for_our_attention_on_cuda():
    from search.trial import kernel_knobs
    from tuning.decode_attention import table_to_json
    from variants.variant import Variant

    table = {(8, 1024): {"num_splits": 8, "tiles": (32, 2, 2)}}
    job = {"device": "cuda", "knobs": table_to_json(table), "kernel_prior": "hand"}
    ours, sdpa = Variant(cache="slab", attention="triton"), Variant(cache="slab", attention="sdpa")
    assert kernel_knobs(job, ours) == table
    assert kernel_knobs(job, sdpa) is None
    assert kernel_knobs({**job, "device": "cpu"}, ours) is None
    assert kernel_knobs({**job, "knobs": None}, ours) is None  # the hand rules: no table


def test_the_phase_times_the_leader_with_the_rules_then_the_table(monkeypatch, tiny_config):
    """Both timings come from the phase itself, back to back; a failure of either is named."""
    from types import SimpleNamespace

    from search import kernel_phase as phase
    from search.setup import Budget
    from search.trial import Record

    table = {(8, 1024): {"num_splits": 4}}
    moved = [{"moved": {"num_splits": 4}}]
    monkeypatch.setattr(
        phase, "run_search", lambda job, v, prior, s: KernelSearch(prior, s, table, moved)
    )
    calls = []

    def timed_with(job, variant, knobs, limit, few_row_table=None, prefill_table=None):
        calls.append(knobs)
        if knobs is None:
            return {"prefill": 1.0, "decode": 5.0}, None
        return ({"prefill": 2.0, "decode": 4.0}, None) if len(calls) == 2 else ({}, "crash\nx")

    monkeypatch.setattr(phase, "timed_with", timed_with)
    job = SimpleNamespace(
        device="cuda",
        args=SimpleNamespace(kernel_search=True),
        budget=Budget(0.0, 300.0),
        budget_s=1200.0,
        kernel_search_s=120.0,
        seconds_left=lambda: 900.0,
        runner=SimpleNamespace(durations=[20.0], kernel_prior="hand", traces=("prefill", "decode")),
        target=SimpleNamespace(config=tiny_config),
    )
    leader = Record(0, "ok", {"cache": "slab", "attention": "triton"})
    found = phase.kernel_phase(job, leader)
    assert calls == [None, table] and found.decoding == ("decode",)
    assert found.kept and found.gain == pytest.approx(1.25)  # prefill's 2x slower is noise here
    found = phase.kernel_phase(job, leader)  # the table's timing fails this time
    assert not found.kept and found.why == "the leader with the table failed: crash"


def test_a_trial_renders_the_jobs_few_row_table_only_for_the_fused_layers():
    from search.trial import few_row_knobs
    from tuning.few_row import table_to_json
    from variants.variant import Variant

    table = {("down", 8): {"tiles": (16, 128, 4, 3), "split_k": 4}}
    job = {"device": "cuda", "few_row_knobs": table_to_json(table)}
    fused = Variant(cache="slab", attention="triton", layers="fused-pdl")
    assert few_row_knobs(job, fused) == table
    assert few_row_knobs(job, Variant(cache="slab", attention="triton", layers="triton")) is None
    assert few_row_knobs({**job, "few_row_knobs": None}, fused) is None  # the rules


def test_a_trial_renders_the_jobs_prefill_table_only_for_our_attention(tmp_path, monkeypatch):
    """The job's table reaches the renderer with the others; an SDPA engine's renderer is
    called without it."""
    from search import trial
    from tuning.prefill_attention import table_to_json
    from variants.variant import Variant

    table = {512: {"tiles": (32, 64, 4, 3)}}
    job = {"device": "cuda", "prefill_knobs": table_to_json(table)}
    ours = Variant(cache="slab", attention="triton", prefill_graphs="pow2")
    assert trial.prefill_knobs(job, ours) == table
    assert trial.prefill_knobs(job, Variant(cache="slab", attention="sdpa")) is None
    assert trial.prefill_knobs({**job, "prefill_knobs": None}, ours) is None  # the rules
    rendered = []

    def render(variant, path, header, budget, **tables):
        rendered.append(tables)
        raise RuntimeError("rendered")  # (the trial stops here)

    monkeypatch.setattr(trial, "load_renderer", lambda name: render)
    for variant in (ours, Variant(cache="slab", attention="sdpa")):
        with pytest.raises(RuntimeError, match="rendered"):
            trial.run_job(
                {**job, "variant": variant.to_dict(), "engine_path": str(tmp_path / "e.py")},
                trial.Phases(tmp_path / "phase"),
            )
    assert rendered == [{"prefill_knobs": table}, {}]


def _fused_job(tiny_config):
    from types import SimpleNamespace

    from search.setup import Budget

    return SimpleNamespace(
        device="cuda",
        args=SimpleNamespace(kernel_search=True),
        budget=Budget(0.0, 300.0),
        budget_s=1200.0,
        seconds_left=lambda: 900.0,
        runner=SimpleNamespace(durations=[20.0], kernel_prior="hand", traces=("decode",)),
        target=SimpleNamespace(config=tiny_config),
    )


def test_a_fused_leader_s_few_row_kernels_are_searched_after_its_attention(
    monkeypatch, tiny_config
):
    """Half the budget for the attention, what it left for the few-row kernels, each less a
    child's own start (a typical trial's until the first child shows its own); the leader timed
    with both tables; the log names both searches' moves. A failed few-row search leaves the
    attention's table to be timed alone."""
    from search import kernel_phase as phase
    from search.trial import Record

    table = {(8, 1024): {"num_splits": 4}}
    few_row = {("down", 8): {"tiles": (16, 128, 4, 3), "split_k": 4}}
    budgets, calls = [], []

    def run_search(job, variant, prior, budget_s):
        budgets.append(budget_s)
        return KernelSearch(prior, budget_s, table, [], seconds=45.0)  # the rules kept

    def run_table_search(job, variant, found, module, budget_s):
        budgets.append(budget_s)
        assert module == "tuning.few_row"
        results = [
            {"kernel": "down", "rows": 8, "steps": 42, "weight": 3.0, "prior_us": 300.0,
             "best_us": 280.0, "tried": 12, "rejected": 2, "moved": {"split_k": 4}},
        ]  # fmt: skip
        return TableSearch(few_row, results)

    def timed_with(job, variant, knobs, limit, few_row_table=None, prefill_table=None):
        calls.append((knobs, few_row_table))
        return {"decode": 5.0 if knobs is None else 4.0}, None

    monkeypatch.setattr(phase, "run_search", run_search)
    monkeypatch.setattr(phase, "run_table_search", run_table_search)
    monkeypatch.setattr(phase, "timed_with", timed_with)
    leader = Record(0, "ok", {"cache": "slab", "attention": "triton", "layers": "fused"})
    found = phase.kernel_phase(_fused_job(tiny_config), leader)
    # 60 s less a typical trial (20 s); the child took 5 s beyond its 40: 75 s left, less 5
    assert budgets == [40.0, 70.0] and found.budget_s == 120.0
    assert calls == [(None, None), (table, few_row)] and found.kept
    text = lines(found)
    assert "down   at   8 rows (42 steps, weight 3.0): a step 300.0 -> 280.0 us" in text
    assert "split_k=4" in text

    def failing(job, variant, found, module, budget_s):
        return TableSearch(why="the kernel search failed (exit 1): OutOfResources")

    monkeypatch.setattr(phase, "run_table_search", failing)
    found = phase.kernel_phase(_fused_job(tiny_config), leader)
    assert found.few_row.table is None
    assert "few-row kernels: the kernel search failed" in lines(found)
    assert found.why == "every bucket searched kept the prior's launch"  # nothing moved


@pytest.mark.parametrize("layers,shares", [("fused-pdl", 3), ("triton", 2)])
def test_a_leader_s_searches_share_what_those_before_them_left(
    monkeypatch, tiny_config, layers, shares
):
    """The decode attention an equal share of the budget (a third with the fused layers'
    few-row kernels, else half), then the prefill attention an equal share of what it left,
    then the few-row kernels the rest (the search that runs out of time), each less a child's
    own start; the leader timed with every table; the log names the prefill buckets' moves, and
    every trace decides (a prefill table moves each one's prefill calls)."""
    from search import kernel_phase as phase
    from search.trial import Record

    table = {(8, 1024): {"num_splits": 4}}
    tables = {
        "tuning.few_row": {("down", 8): {"tiles": (16, 128, 4, 3), "split_k": 4}},
        "tuning.prefill_attention": {512: {"tiles": (32, 64, 4, 3)}},
    }
    prefill_results = [
        {"tokens": 512, "calls": 14, "weight": 1.87, "prompts": 4, "longest": 128,
         "prior_us": 90.0, "best_us": 70.0, "tried": 13, "rejected": 1,
         "moved": {"block_m": 32, "warps": 4}},
    ]  # fmt: skip
    budgets, searched, calls = [], [], []

    def run_search(job, variant, prior, budget_s):
        budgets.append(budget_s)
        return KernelSearch(prior, budget_s, table, [], seconds=budget_s + 5.0)  # its start 5 s

    def run_table_search(job, variant, found, module, budget_s):
        budgets.append(budget_s)
        searched.append(module)
        found.seconds += 10.0  # it finished early
        results = prefill_results if module == "tuning.prefill_attention" else []
        return TableSearch(tables[module], results)

    def timed_with(job, variant, knobs, limit, few_row_table=None, prefill_table=None):
        calls.append((knobs, few_row_table, prefill_table))
        return {"prefill": 1.0 if knobs is None else 0.9, "decode": 5.0}, None

    monkeypatch.setattr(phase, "run_search", run_search)
    monkeypatch.setattr(phase, "run_table_search", run_table_search)
    monkeypatch.setattr(phase, "timed_with", timed_with)
    job = _fused_job(tiny_config)
    job.runner.traces = ("prefill", "decode")
    leader = Record(
        0,
        "ok",
        {"cache": "slab", "attention": "triton", "layers": layers, "prefill_graphs": "pow2"},
    )
    found = phase.kernel_phase(job, leader)
    first = 120.0 / shares - 20.0  # its share less a typical trial, then less its own 5 s
    spent = first + 5.0
    after = [(120.0 - spent) / (shares - 1) - 5.0, 120.0 - spent - 10.0 - 5.0][: shares - 1]
    assert budgets == [pytest.approx(b) for b in [first, *after]] and found.budget_s == 120.0
    assert searched == ["tuning.prefill_attention", "tuning.few_row"][: shares - 1]
    few_row = tables["tuning.few_row"] if shares == 3 else None
    assert calls == [(None, None, None), (table, few_row, tables["tuning.prefill_attention"])]
    assert found.decoding == () and found.kept  # prefill alone moved: all traces decide
    text = lines(found)
    assert (
        "prefill   512 tokens (14 calls, weight 1.87, 4 prompts, longest 128): its attention"
        in text
    )
    assert "90.0 -> 70.0 us, 13 tried (1 wrong or refused): block_m=32, warps=4" in text


def test_with_the_neutral_prior_a_trial_and_the_written_engine_run_no_hand_rule(
    tiny_config, monkeypatch
):
    """--neutral-kernels: without a search's table, every kernel table an engine reads holds
    the neutral launches (the decode attention's, the few-row kernels', the prefill
    attention's); a search's table stands where there is one; the hand prior and a CPU engine
    carry none (the launchers' rules)."""
    from search.trial import few_row_knobs, neutral_tables, prefill_knobs
    from tuning import decode_attention, few_row, prefill_attention
    from variants.spec import ModelSpec
    from variants.variant import Variant

    monkeypatch.setattr(few_row, "device_sm_count", lambda device: 132)
    monkeypatch.setattr(few_row, "device_capability", lambda device: (9, 0))
    attention = {(8, 1024): {"tiles": (32, 4, 2)}}  # (the decode attention's needs the GPU's)
    monkeypatch.setattr(decode_attention, "prior_table", lambda *args: dict(attention))
    spec = ModelSpec.from_config(tiny_config)
    variant = Variant(cache="slab", attention="triton", layers="fused-pdl", graphs="pow2",
                      prefill_graphs="pow2")  # fmt: skip
    job = {"device": "cuda", "config": tiny_config, "kernel_prior": "neutral"}
    few = few_row_knobs(job, variant)
    assert few and few == few_row.prior_table(spec, variant, "neutral", "cuda")
    assert prefill_knobs(job, variant) == prefill_attention.prior_table(spec, "neutral")
    assert neutral_tables("cuda", tiny_config, variant) == {
        "knobs": attention, "few_row_knobs": few, "prefill_knobs": prefill_knobs(job, variant)
    }  # fmt: skip
    searched = {("down", 8): {"tiles": (16, 128, 4, 3), "split_k": 4}}
    job_with = {**job, "few_row_knobs": few_row.table_to_json(searched)}
    assert few_row_knobs(job_with, variant) == searched
    for other in ({**job, "kernel_prior": "hand"}, {**job, "device": "cpu"}):
        assert few_row_knobs(other, variant) is None and prefill_knobs(other, variant) is None
    assert neutral_tables("cpu", tiny_config, variant) == {}


def test_with_the_neutral_prior_the_written_engine_carries_the_neutral_tables(
    tiny_config, monkeypatch
):
    """The engine run.sh writes after a neutral study whose kernel search was not kept: its
    renderer gets the neutral tables (not none, which would be the H200's rules); after a kept
    search, the search's tables for the leader over them."""
    from types import SimpleNamespace

    from search import cli
    from search.trial import Record
    from variants.variant import Variant

    variant = Variant(cache="slab", attention="triton", layers="fused-pdl", graphs="pow2")
    neutral = {"knobs": {"n": 1}, "few_row_knobs": {"f": 1}}
    monkeypatch.setattr(cli, "neutral_tables", lambda device, config, v: dict(neutral))
    monkeypatch.setattr(cli, "candidates", lambda job, records, ranked: ranked)
    rendered = []

    def renderer(v, path, text, budget, weights, **tables):
        rendered.append(tables)

    monkeypatch.setattr(cli, "load_renderer", lambda name: renderer)
    monkeypatch.setattr(cli, "write_verified", lambda found, render, *rest: render(variant, 0, ""))
    leader = Record(0, "ok", variant.to_dict())
    found = SimpleNamespace(kept=True, table={"a": 1}, few_row=SimpleNamespace(table=None),
                            prefill=SimpleNamespace(table=None))  # fmt: skip
    for prior, kernels, want in (
        ("neutral", None, neutral),
        ("neutral", found, {**neutral, "knobs": {"a": 1}}),
        ("hand", None, {}),
    ):
        job = SimpleNamespace(
            kernels=kernels, runner=SimpleNamespace(kernel_prior=prior, engine_budget_gib=8.0),
            target=SimpleNamespace(weights_format="course", config=tiny_config, config_path="c",
                                   weight_dir="w"),
            args=SimpleNamespace(renderer="default"), device="cuda", workspace=None,
            verify_timeout=1, gate="course", stress_positions=1,
        )  # fmt: skip
        cli.RunJob.write_engine(job, [leader], [leader], None)
        assert rendered[-1] == want, prior


@pytest.mark.parametrize(
    "share,searched",
    [
        (3 * (LEAST_S + 20.0), ["decode", "prefill", "few_row"]),
        (2 * (LEAST_S + 20.0), ["decode", "prefill"]),  # the few-row kernels' dropped first
        (LEAST_S + 20.0, ["decode"]),
        (LEAST_S + 19.0, []),  # not even the decode attention's own start and LEAST_S fit
    ],
)
def test_a_share_too_short_for_every_search_runs_fewer_and_keeps_its_seconds(
    monkeypatch, tiny_config, share, searched
):
    """Children that take their whole budget and a typical trial's start each: the searches
    that cannot search LEAST_S in their share are not run (the last first), and the phase's
    seconds stay within its share; results.log says why those were not run."""
    from search import kernel_phase as phase
    from search.trial import Record

    ran, total = [], []

    def run_search(job, variant, prior, budget_s):
        ran.append("decode")
        total.append(budget_s + 20.0)
        return KernelSearch(prior, budget_s, {(8, 1024): {}}, [], seconds=budget_s + 20.0)

    def run_table_search(job, variant, found, module, budget_s):
        ran.append(module.removeprefix("tuning.").removesuffix("_attention"))
        total.append(budget_s + 20.0)
        found.seconds += budget_s + 20.0
        return TableSearch({}, [])

    monkeypatch.setattr(phase, "run_search", run_search)
    monkeypatch.setattr(phase, "run_table_search", run_table_search)
    monkeypatch.setattr(phase, "search_budget_s", lambda *args: share)
    leader = Record(
        0, "ok",
        {"cache": "slab", "attention": "triton", "layers": "fused-pdl", "prefill_graphs": "pow2"},
    )  # fmt: skip
    found = phase.kernel_phase(_fused_job(tiny_config), leader)
    assert ran == searched
    assert sum(total) == pytest.approx(share if searched else 0.0)
    text = lines(found)
    if "few_row" not in searched and searched:
        assert "few-row kernels: no time left for it in the kernel search's share" in text
    if not searched:
        assert found.why.startswith("no time left for it in this budget")


def _full(number, tps, **variant):
    from search.trial import Record

    attrs = {"tokens_per_s": tps, "full_tokens_per_s": tps, "full_status": "ok",
             "variant_name": f"v{number}"}  # fmt: skip
    return Record(number, "ok", {"cache": "paged", "attention": "triton", **variant}, attrs)


def test_a_close_rival_is_one_with_a_search_the_leader_lacks():
    """A Triton-stack leader just ahead of the fused layers with the rules: the fused layers'
    few-row kernels are searched, the Triton stack's cuBLAS projections are not, so the fused
    trial is a rival. A trial past CONTEND, one whose searches
    the leader's cover, or one not re-measured in the grader's protocol is not."""
    from search.kernel_phase import CONTEND, rival, searches
    from search.trial import Record
    from variants.variant import Variant

    triton, fused = {"layers": "triton"}, {"layers": "fused"}
    assert searches(Variant.from_dict({"cache": "slab", "attention": "sdpa"})) == ()
    assert searches(Variant(cache="slab", attention="triton", layers="fused-pdl")) == (
        "decode attention", "few-row kernels"
    )  # fmt: skip
    leader = _full(59, 1000.0, **triton)
    close = _full(52, 990.0, **fused)
    assert rival([leader, _full(4, 999.0, **triton), close]) is close
    assert rival([leader, _full(52, 1000.0 * (1 - CONTEND) - 1, **fused)]) is None
    assert rival([_full(52, 1000.0, **fused), _full(59, 999.0, **triton)]) is None  # covered
    unmeasured = Record(52, "ok", close.variant, {"tokens_per_s": 999.0, "variant_name": "v"})
    assert rival([leader, unmeasured]) is None
    sdpa = _full(7, 1000.0, layers="triton", attention="sdpa")
    assert rival([sdpa, close]) is close  # nothing of the leader's is searched


def test_the_overall_gain_counts_each_trace_of_the_ranking():
    from search.kernel_phase import overall_gain

    search = searched({"decode": 5.0, "prefill": 1.0}, {"decode": 4.0, "prefill": 2.0},
                      decoding=("decode",))  # fmt: skip
    traces = ("prefill", "decode", "mixed", "continuous")
    assert overall_gain(search, traces) == pytest.approx(1.25**0.25)  # prefill did not decide
    assert overall_gain(searched({"decode": 5.0}, {"decode": 6.0}), traces) == 1.0  # not kept
    assert overall_gain(None, traces) == 1.0


@pytest.mark.parametrize("rival_gain,won", [(1.10, True), (1.01, False)])
def test_the_leader_and_a_close_rival_are_each_searched_and_the_faster_tuned_goes_first(
    monkeypatch, rival_gain, won
):
    """The shares split by the searches each runs, the leader's leaving the rival's share and
    timings; with a rival 1 % behind, a 10 % gain from its tables wins it the place and a 1 %
    one does not (the leader's tables gained 2 %); without a rival the leader gets every
    contender's share."""
    from types import SimpleNamespace

    from search import kernel_phase as phase
    from search.setup import KERNEL_CONTENDERS, Budget

    calls, gains = [], {0: 1.02, 1: rival_gain}

    def kernel_phase(job, leader, shares=1.0, also_reserve_s=0.0):
        calls.append((leader.number, shares, also_reserve_s))
        gain = gains[leader.number]
        return searched({"decode": gain}, {"decode": 1.0})

    monkeypatch.setattr(phase, "kernel_phase", kernel_phase)
    budget = Budget(0.0, 300.0, total_s=1200.0, kept_s=120.0, kept_trials=4.0,
                    kept_contenders=KERNEL_CONTENDERS)  # fmt: skip
    job = SimpleNamespace(
        device="cuda", budget=budget, budget_s=1200.0,
        runner=SimpleNamespace(durations=[10.0], kernel_prior="hand", traces=("decode",)),
    )  # fmt: skip
    leader, close, third = (_full(0, 1000.0), _full(1, 990.0, layers="fused"), _full(2, 980.0))
    found, ranked, contest = phase.kernel_contest(job, [leader, close, third])
    # two shares of 120 s split by the searches: the leader's decode attention; the rival's
    # too, and its few-row kernels
    third_s, reserve_s = 2 / 3, 4 / 3 * 120.0 + phase.LEADER_TIMINGS * 10.0
    assert calls == [(0, pytest.approx(third_s), pytest.approx(reserve_s)), (1, 4 / 3, 0.0)]
    assert contest.won is won and contest.estimates == pytest.approx((1020.0, 990 * rival_gain))
    assert [r.number for r in ranked] == ([1, 0, 2] if won else [0, 1, 2])
    assert found is contest.searches[1 if won else 0]
    assert "written: the " + ("rival" if won else "leader") in contest.lines()
    calls.clear()
    found, ranked, contest = phase.kernel_contest(job, [leader, third])
    assert calls == [(0, KERNEL_CONTENDERS, 0.0)] and contest is None
    # the ranking's ties stand: within 1 % with their tables, a peak 40 % smaller keeps its place
    leader.attrs["full_peak_mib"], close.attrs["full_peak_mib"] = 5000.0, 9000.0
    gains[1] = 1.035  # 1,024.65 against 1,020 tokens/s
    assert not phase.kernel_contest(job, [leader, close])[2].won
    job.args = SimpleNamespace(kernel_search=False)  # the phase off: no contest either
    calls.clear()
    assert phase.kernel_contest(job, [leader, close])[2] is None
    job.args.kernel_search = True  # nor where the budget kept one contender's share
    job.budget.total_s = 900.0  # two of (120 s and 4 trials of 10 s) are over 35 % of it
    assert job.budget.contenders([10.0]) == 1
    assert phase.kernel_contest(job, [leader, close])[2] is None


def test_the_results_log_says_the_kernel_search_decided():
    from search.kernel_phase import Contest
    from search.report import _why

    leader, close = _full(59, 1000.0), _full(52, 995.0, layers="fused")
    leader.attrs.update(full_peak_mib=10234.0)
    close.attrs.update(full_peak_mib=10349.0)
    contest = Contest(leader, close, (None, None), (1000.0, 1040.0), True)
    text = _why(close, [close, leader], contest=contest)
    assert "the kernel search decided: with the tables 1,040 against 1,000 tokens/s" in text
    assert "peak memory" not in text.split("\n")[1]


def test_the_results_log_has_the_search_of_the_contender_not_written():
    from search.kernel_phase import Contest
    from search.report import contest_section

    leader, close = _full(59, 1000.0), _full(52, 995.0, layers="fused")
    tuned = searched({"decode": 5.0}, {"decode": 4.0})
    text = contest_section(Contest(leader, close, (None, tuned), (1000.0, 1243.75), True))
    assert text.startswith("== kernel search of the leader, not written ==")
    assert "leader trial 59 v59: 1,000 tokens/s (full protocol), 1,000 with the rules" in text
    assert "rival trial 52 v52: 995 tokens/s (full protocol), 1,244 with its tables kept" in text
    assert "written: the rival" in text and "not run (no CUDA" in text
    text = contest_section(Contest(leader, close, (tuned, None), (1250.0, 995.0), False))
    assert text.startswith("== kernel search of the close rival, not written ==")


def test_each_contender_is_written_with_its_own_tables(tiny_config, monkeypatch):
    """The contest's winner first with its tables; should it fail verification, the other
    contender with its own; any other candidate with the rules."""
    from types import SimpleNamespace

    from search import cli
    from search.kernel_phase import Contest
    from variants.variant import Variant

    def kept(knobs):
        return SimpleNamespace(kept=True, table=knobs, few_row=SimpleNamespace(table=None),
                               prefill=SimpleNamespace(table=None))  # fmt: skip

    leader, close = _full(59, 1000.0, layers="triton"), _full(52, 995.0, layers="fused")
    third = _full(4, 990.0, layers="torch")
    contest = Contest(leader, close, (kept({"l": 1}), kept({"r": 1})), (1000.0, 1050.0), True)
    monkeypatch.setattr(cli, "candidates", lambda job, records, ranked: ranked)
    rendered = []

    def renderer(v, path, text, budget, weights, **tables):
        rendered.append((v.layers, tables))

    monkeypatch.setattr(cli, "load_renderer", lambda name: renderer)

    def write_verified(found, render, *rest):
        for r in found:
            render(Variant.from_dict(r.variant), 0, "")

    monkeypatch.setattr(cli, "write_verified", write_verified)
    job = SimpleNamespace(
        kernels=contest.searches[1], contest=contest,
        runner=SimpleNamespace(kernel_prior="hand", engine_budget_gib=8.0),
        target=SimpleNamespace(weights_format="course", config=tiny_config, config_path="c",
                               weight_dir="w"),
        args=SimpleNamespace(renderer="default"), device="cuda", workspace=None,
        verify_timeout=1, gate="course", stress_positions=1,
    )  # fmt: skip
    ranked = [close, leader, third]
    cli.RunJob.write_engine(job, ranked, ranked, None)
    assert rendered == [
        ("fused", {"knobs": {"r": 1}}), ("triton", {"knobs": {"l": 1}}), ("torch", {})
    ]  # fmt: skip
