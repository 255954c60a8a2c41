"""The kernel search as a phase of the main job (`bash run.sh`): after the study, the leading
assembly's decode attention is searched on this GPU (tuning/decode_attention.py, in a child
process, its table cached under studies/kernels/), then with prefill graphs its prefill attention
(tuning/prefill_attention.py, likewise) and with the fused layers its few-row kernels (few_row.py);
then the leader is timed with the tables in the grader's protocol, behind the correctness gate;
they are written into engine.py only where it is faster on the traces' geometric mean.
results.log says what moved and by how much.

The trials were ranked with the rules, and a search's gain differs by assembly: the fused layers'
few-row kernels are searched, the Triton stack's cuBLAS projections are not. So a close rival (a
re-measured trial within CONTEND of the leader) with a search the leader lacks is searched too,
the shares split by the searches each runs, and the engine whose tables make it faster is written
(`kernel_contest`). Without a rival the leader gets both shares."""

import importlib
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from evaluator.benchmark_traces import get_trace
from search.setup import KERNEL_CONTENDERS, LEADER_TIMINGS, LEAST_S, search_share_s
from search.trial import run_child
from search.write import after_remeasure_s, first_ranked
from tuning.decode_attention import table_from_json, table_to_json
from tuning.few_row import table_to_json as few_row_to_json
from tuning.prefill_attention import table_to_json as prefill_to_json
from variants.variant import Variant


@dataclass
class TableSearch:
    """A search after the decode attention's (the few-row kernels', the prefill attention's):
    its table (None: it gave none), its per-bucket results and why it gave none."""

    table: dict | None = None
    results: list = field(default_factory=list)
    why: str = ""


@dataclass
class KernelSearch:
    """What the phase did, for results.log and the write phase."""

    prior: str
    budget_s: float
    table: dict | None = None
    results: list = field(default_factory=list)
    seconds: float = 0.0
    cached: str = ""
    before: dict = field(default_factory=dict)  # trace -> seconds, the leader as it was
    after: dict = field(default_factory=dict)  # trace -> seconds, with the table
    kept: bool = False
    why: str = ""
    # the traces the tables can move (those with decode steps; empty: all): a prefill-only
    # trace's noise must not decide on tables of decode steps alone
    decoding: tuple = ()
    # the few-row kernels' search (the fused layers only), per (kernel, rows bucket), and the
    # prefill attention's (prefill graphs only), per token bucket
    few_row: TableSearch = field(default_factory=TableSearch)
    prefill: TableSearch = field(default_factory=TableSearch)

    @property
    def moved(self) -> bool:
        searched = (*self.results, *self.few_row.results, *self.prefill.results)
        return any(r["moved"] for r in searched)

    @property
    def gain(self) -> float | None:
        """The geometric mean over the traces both measured of before / after (> 1: faster)."""
        common = [t for t in self.after if self.before.get(t) and self.after[t]]
        common = [t for t in common if not self.decoding or t in self.decoding]
        if not common:
            return None
        return math.exp(sum(math.log(self.before[t] / self.after[t]) for t in common) / len(common))


# A re-measured trial within this share of the leader's throughput (the grader's protocol) is a
# close rival: about what the kernel search gains at the 1B model's shapes (docs/PERF.md).
CONTEND = 0.03


def search_budget_s(total_s: float, left_s: float, reserve_s: float, prior: str = "hand",
                    shares: float = 1.0) -> float:  # fmt: skip
    """Seconds for the search: `shares` of its share of the run's budget (`search_share_s`),
    within what the steps after it leave (0: no search)."""
    budget = min(shares * search_share_s(total_s, prior), left_s - reserve_s)
    return budget if budget >= LEAST_S else 0.0


def decide(search: KernelSearch) -> KernelSearch:
    """Keep the table where the leader with it passed the gate and is faster on the geomean."""
    gain = search.gain
    if not search.after:
        search.kept, search.why = False, search.why or "the leader with the table was not timed"
    elif gain is None or gain <= 1.0:
        search.kept = False
        search.why = f"not faster on the traces (geomean {gain or 0:.3f}x): the rules stay"
    else:
        search.kept, search.why = True, f"{gain:.3f}x on the traces' geometric mean"
    if search.decoding and set(search.after) - set(search.decoding):
        search.why += " (of those with decode steps)"
    return search


def search_child(job, variant, module: str, budget_s: float, *options) -> tuple:
    """(the search's JSON or None, seconds, its log or why it failed): `python -m module` for
    `variant` in a child process (so a crash or a hung compile costs only this phase), its
    table cached per GPU, model shape, layout and Triton version."""
    folder = Path(getattr(job.args, "studies_dir", "studies")) / "kernels"
    with tempfile.TemporaryDirectory(prefix="kernels-") as tmp:
        out, log_path = Path(tmp) / "table.json", Path(tmp) / "log.txt"
        cmd = [
            sys.executable, "-m", module,
            "--config", str(job.target.config_path), "--weight-dir", str(job.target.weight_dir),
            "--variant", json.dumps(variant.to_dict()), *options,
            "--budget", f"{budget_s:.0f}", "--cache-dir", str(folder), "--json", str(out),
        ]  # fmt: skip
        code, seconds = run_child(cmd, log_path, budget_s + 180)
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        if code != 0 or not out.is_file():
            last = (text.strip().splitlines() or [""])[-1]
            return None, seconds, f"the kernel search failed (exit {code}): {last}"
        return json.loads(out.read_text()), seconds, text


def run_search(job, variant, prior: str, budget_s: float) -> KernelSearch:
    """The decode attention's table for `variant` (`search_child`)."""
    found = KernelSearch(prior, budget_s)
    data, found.seconds, text = search_child(
        job, variant, "tuning.decode_attention", budget_s, "--prior", prior
    )
    if data is None:
        found.why = text
        return found
    found.table = table_from_json(data["table"])
    found.results = data["results"]
    found.cached = next((ln[6:] for ln in text.splitlines() if ln.startswith("table ")), "")
    return found


def run_table_search(job, variant, found: KernelSearch, module: str, budget_s: float):
    """A search after the decode attention's, `python -m module` for `variant`
    (`search_child`), its seconds added to `found`'s: a TableSearch. Where it fails, the
    other tables stand without it."""
    data, seconds, text = search_child(job, variant, module, budget_s, "--prior", found.prior)
    found.seconds += seconds
    if data is None:
        return TableSearch(why=text)
    from_json = importlib.import_module(module).table_from_json
    return TableSearch(from_json(data["table"]), data["results"])


def timed_with(job, variant, table: dict | None, timeout_s: float, few_row_table=None,
               prefill_table=None) -> tuple:  # fmt: skip
    """(trace -> seconds, failure): `variant` in the grader's protocol behind the gate, with
    the tables (None: the rules)."""
    runner = replace(
        job.runner,
        knobs=None if table is None else table_to_json(table),
        few_row_knobs=few_row_to_json(few_row_table) if few_row_table else None,
        prefill_knobs=prefill_to_json(prefill_table) if prefill_table else None,
    )
    outcome = runner.run(variant, protocol="full", check=True, timeout_s=timeout_s)
    feasible = outcome.status == "ok" and all(c <= 0 for c in outcome.attrs.get("constraint", [1]))
    if not feasible:
        return {}, outcome.reason or f"status {outcome.status}, constraint not met"
    seconds = {
        k.removeprefix("full_seconds_"): v
        for k, v in outcome.attrs.items()
        if k.startswith("full_seconds_")
    }
    return seconds, None


def _moved(r: dict, where: str, start: str, timed: str = "a step") -> str:
    """A searched bucket's line: the time of what is `timed` from `start` to the best, and
    what moved."""
    moved = ", ".join(f"{k}={v}" for k, v in r["moved"].items()) or f"the {start} kept"
    return (
        f"{where}: {timed} {r['prior_us']:.1f} -> {r['best_us']:.1f} us, {r['tried']} tried"
        f" ({r['rejected']} wrong or refused): {moved}"
    )


def lines(search: KernelSearch | None) -> str:
    """The results log's section."""
    if search is None:
        return "not run (no CUDA, or the chosen engine does not launch our decode attention)"
    out = [
        f"prior: {search.prior} rules; budget {search.budget_s:.0f} s, took {search.seconds:.0f} s"
    ]
    if search.cached:
        out.append(f"table: {search.cached}")
    start = "rules" if search.prior == "hand" else "neutral launch"
    for r in search.results:
        where = f"{r['rows']:3d} rows x {r['context']:5d} ({r['steps']} steps, weight"
        out.append(_moved(r, f"{where} {r.get('weight')}, longest {r['longest']})", "prior"))
    if search.few_row.why:
        out.append(f"few-row kernels: {search.few_row.why}")
    for r in search.few_row.results:
        where = f"{r['kernel']:6s} at {r['rows']:3d} rows ({r['steps']} steps, weight"
        out.append(_moved(r, f"{where} {r['weight']})", start))
    if search.prefill.why:
        out.append(f"prefill attention: {search.prefill.why}")
    for r in search.prefill.results:
        where = f"prefill {r['tokens']:5d} tokens ({r['calls']} calls, weight {r['weight']}, "
        where += f"{r['prompts']} prompts, longest {r['longest']})"
        out.append(_moved(r, where, start, "its attention"))
    if search.after:
        out.append("trace            rules ms   tuned ms")
        for trace in sorted(search.after):
            before = search.before.get(trace)
            cell = f"{1e3 * before:10.3f}" if before else "         -"
            out.append(f"{trace:14s} {cell} {1e3 * search.after[trace]:10.3f}")
    out.append(("kept: " if search.kept else "not kept: ") + search.why)
    return "\n".join(out)


def searches(variant: Variant) -> tuple:
    """The searches kernel_phase runs for `variant` (none where our decode attention is not
    launched)."""
    if variant.attention != "triton":
        return ()
    prefill, fused = variant.prefill_graphs != "off", variant.layers in ("fused", "fused-pdl")
    return ("decode attention", *["prefill attention"] * prefill, *["few-row kernels"] * fused)


def rival(ranked: list) -> object | None:
    """The best trial after the leader re-measured like it (the grader's protocol), within
    CONTEND of its throughput, with a search the leader's assembly does not have; None if
    there is none."""
    if not ranked or not ranked[0].has_full:
        return None
    leader, mine = ranked[0], set(searches(Variant.from_dict(ranked[0].variant)))
    for r in ranked[1:]:
        if not r.has_full or r.tokens_per_s < leader.tokens_per_s * (1 - CONTEND):
            continue
        theirs = set(searches(Variant.from_dict(r.variant)))
        if theirs and not theirs <= mine:
            return r
    return None


def overall_gain(search: KernelSearch | None, traces) -> float:
    """What the tables, where kept, do to the geometric mean over `traces` (the ranking's):
    each trace that decided at before / after, the others unmoved."""
    if search is None or not search.kept:
        return 1.0
    moved = [t for t in traces if search.before.get(t) and search.after.get(t)]
    moved = [t for t in moved if not search.decoding or t in search.decoding]
    logs = [math.log(search.before[t] / search.after[t]) for t in moved]
    return math.exp(sum(logs) / len(tuple(traces))) if traces else 1.0


@dataclass
class Contest:
    """The leader and a close rival, each with its search: their throughput in the grader's
    protocol times their tables' gain; `won`: whether the rival is written (ranked first by
    those numbers)."""

    leader: object
    rival: object
    searches: tuple  # (the leader's KernelSearch or None, the rival's)
    estimates: tuple  # tokens/s with the tables: (the leader's, the rival's)
    won: bool

    def lines(self) -> str:
        out = []
        for role, r, found, est in zip(("leader", "rival"), (self.leader, self.rival),
                                       self.searches, self.estimates):  # fmt: skip
            kept = "its tables kept" if found is not None and found.kept else "the rules"
            out.append(f"{role} trial {r.number} {r.name}: {r.tokens_per_s:,.0f} tokens/s "
                       f"(full protocol), {est:,.0f} with {kept}")  # fmt: skip
        who = "the rival" if self.won else "the leader"
        out.append(f"written: {who} (ranked by those numbers)")
        return "\n".join(out)


def kernel_contest(job, ranked: list) -> tuple:
    """(the written candidate's KernelSearch or None, `ranked` with that candidate first, the
    Contest or None): the leader's search, in every contender's share where no close rival has
    a search it lacks (`rival`) or the budget kept one share (`Budget.contenders`); else the
    leader's and the rival's, the shares split by how many searches each runs, and the one
    faster with its tables first."""
    on = getattr(getattr(job, "args", None), "kernel_search", True) is not False
    on = on and ranked and str(job.device).startswith("cuda")
    other = rival(ranked) if on and job.budget.contenders(job.runner.durations) > 1 else None
    if other is None:
        return kernel_phase(job, ranked[0] if ranked else None, KERNEL_CONTENDERS), ranked, None
    # the shares kept for the phase, split by the searches each runs (each search alike)
    counts = [len(searches(Variant.from_dict(r.variant))) for r in (ranked[0], other)]
    shares = [KERNEL_CONTENDERS * n / sum(counts) for n in counts]
    typical = job.budget.typical_trial_s(job.runner.durations)
    theirs_s = shares[1] * search_share_s(job.budget_s, job.runner.kernel_prior)
    mine = kernel_phase(job, ranked[0], shares[0], theirs_s + LEADER_TIMINGS * typical)
    theirs = kernel_phase(job, other, shares[1])
    traces = tuple(job.runner.traces)
    estimates = tuple(
        r.tokens_per_s * overall_gain(found, traces)
        for r, found in ((ranked[0], mine), (other, theirs))
    )  # fmt: skip
    # as the ranking orders them (search.write: ties and peak memory), by those numbers
    tuned = [replace(r, attrs={**r.attrs, "full_tokens_per_s": e})
             for r, e in zip((ranked[0], other), estimates)]  # fmt: skip
    won = first_ranked(tuned).number == other.number
    contest = Contest(ranked[0], other, (mine, theirs), estimates, won)
    if not won:
        return mine, ranked, contest
    return theirs, [other, *(r for r in ranked if r is not other)], contest


def kernel_phase(job, leader, shares: float = 1.0, also_reserve_s: float = 0.0):
    """Search the leading trial's decode attention (and its few-row kernels and prefill
    attention where it runs them), time the leader with the tables, decide; in `shares` of the
    kernel search's share, leaving `also_reserve_s` for what follows it. None where there is
    nothing to search: no CUDA, the phase off, or a leader that does not launch our decode
    attention."""
    if leader is None or not str(job.device).startswith("cuda"):
        return None
    variant = Variant.from_dict(leader.variant)
    if variant.attention != "triton" or getattr(job.args, "kernel_search", True) is False:
        return None
    typical = job.budget.typical_trial_s(job.runner.durations)
    reserve = after_remeasure_s(job, kernels=False) + LEADER_TIMINGS * typical + also_reserve_s
    prior = job.runner.kernel_prior
    left = job.seconds_left()
    found = KernelSearch(prior, search_budget_s(job.budget_s, left, reserve, prior, shares))
    if found.budget_s <= 0:
        found.why = "no time left for it in this budget"
        return found
    # The searches in turn, each an equal share of what those before it left: the decode
    # attention's, the prefill graphs' attention's (it often finishes early), the fused layers'
    # few-row kernels' (the one that runs out of time). A search's child takes its own start
    # (imports, its engine's build, first compiles) beyond the seconds it searches: a typical
    # trial's until the first child has shown it. Those that cannot search LEAST_S seconds in
    # their share are not run, the last first, so that the phase keeps its share.
    fused, prefill = variant.layers in ("fused", "fused-pdl"), variant.prefill_graphs != "off"
    later = ["tuning.prefill_attention"] * prefill + ["tuning.few_row"] * fused
    budget_s, own_start = found.budget_s, typical

    def searching_s(searches: int, spent: float) -> float:  # a search's seconds, its start apart
        return (budget_s - spent) / searches - own_start

    runs = len(later)
    while runs and searching_s(1 + runs, 0.0) < LEAST_S:
        runs -= 1
    first = searching_s(1 + runs, 0.0)
    if first < LEAST_S:
        found.why = "no time left for it in this budget (a search's own start included)"
        return found
    found = run_search(job, variant, prior, first)
    if found.table is None:
        return found
    found.budget_s, own_start = budget_s, max(0.0, found.seconds - first)
    for i, module in enumerate(later):
        given = searching_s(runs - i, found.seconds) if i < runs else 0.0
        if given < LEAST_S:
            done = TableSearch(why="no time left for it in the kernel search's share")
        else:
            done = run_table_search(job, variant, found, module, given)
        if module == "tuning.prefill_attention":
            found.prefill = done
        else:
            found.few_row = done
    if not found.moved:
        found.why = "every bucket searched kept the prior's launch"
        return found
    # the leader timed with the rules and then with the table, back to back (numbers from the
    # re-measure, minutes earlier, differ by a few percent on their own)
    config = job.target.config
    if not found.prefill.table:  # (a prefill table moves every trace's prefill calls)
        decoding = (t for t in job.runner.traces if get_trace(t, config).decode_tokens)
        found.decoding = tuple(decoding)
    limit = LEADER_TIMINGS * typical
    found.before, failure = timed_with(job, variant, None, limit)
    if failure:
        found.why = f"the leader with the {prior} rules failed: {failure.splitlines()[0]}"
    else:
        found.after, failure = timed_with(
            job, variant, found.table, limit, found.few_row.table, found.prefill.table
        )
        if failure:
            found.why = f"the leader with the table failed: {failure.splitlines()[0]}"
    return decide(found)
