"""Continuous batching over an engine's prefill / decode / remove: each step admits waiting
requests (up to a live-request cap and a prefill token budget), decodes every running one, and
retires finished ones at once so their slots go to the queue. Records time to first token and
per-token latencies. An engine call that raises fails only the requests whose own call fails.
Not rendered into engines; the serving layer of the notebooks and of `python -m search serve`.
"""

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from variants.serving.sampling import greedy_tokens

log = logging.getLogger(__name__)


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class ServingRequest:
    """A prompt (1-D int64 ids) and when to stop: after max_new_tokens, or on one of eos_ids.
    `sampler` (logits [1, vocab] -> ids [1]) is the request's own, else the scheduler's."""

    request_id: int
    prompt: torch.Tensor
    max_new_tokens: int
    eos_ids: frozenset = frozenset()
    sampler: Callable | None = None
    state: RequestState = RequestState.WAITING
    output: list = field(default_factory=list)
    error: str | None = None  # why the engine failed this request
    arrival_s: float | None = None
    token_times_s: list = field(default_factory=list)  # clock time of each generated token

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1")
        if self.prompt.dim() != 1 or self.prompt.numel() == 0:
            raise ValueError(f"request {self.request_id}: prompt must be a non-empty 1-D tensor")

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def finish_reason(self) -> str | None:
        """Why it ended: error, stop (an EOS id) or length (max_new_tokens); None: running."""
        if self.error is not None:
            return "error"
        if self.output and self.output[-1] in self.eos_ids:
            return "stop"
        return "length" if len(self.output) >= self.max_new_tokens else None

    @property
    def ttft_s(self) -> float:
        """Time to first token: from arrival (add) to the token out of the prefill."""
        return self.token_times_s[0] - self.arrival_s

    @property
    def token_latencies_s(self) -> list:
        """Gaps between consecutive generated tokens (one per decode step this request ran)."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token answer)."""
        gaps = self.token_latencies_s
        return sum(gaps) / len(gaps) if gaps else 0.0


class ContinuousBatchScheduler:
    """`add` requests, then `step` until `idle` (or `run` a list to the end).

    A step: (1) admit waiting requests in arrival order while fewer than `max_live` run and
    their prompts fit the `prefill_token_budget` (the first admitted prompt of a step always
    fits, so a long prompt cannot starve), prefill them together and sample their first token;
    (2) decode every request that was running before the step, one token each; (3) finish
    requests at max_new_tokens or eos and `remove` them from the engine.
    """

    def __init__(
        self,
        engine,
        sampler=greedy_tokens,
        max_live: int = 8,
        prefill_token_budget: int = 512,
        clock=time.perf_counter,
        history: bool = True,
    ):
        """`history` keeps every finished request and per-step count (for `run` and the
        notebooks); a long-running server turns it off."""
        if max_live < 1 or prefill_token_budget < 1:
            raise ValueError("max_live and prefill_token_budget must be >= 1")
        self.engine, self.sampler, self.clock = engine, sampler, clock
        self.max_live, self.prefill_token_budget = max_live, prefill_token_budget
        self.history = history
        self.waiting: deque = deque()
        self.running: dict = {}  # request id -> ServingRequest, in admission order
        self.finished: list = []
        self.steps = 0
        self.live_per_step: list = []  # running requests during each step's decode

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, request: ServingRequest) -> None:
        if request.request_id in self.running or any(
            r.request_id == request.request_id for r in self.waiting
        ):
            raise ValueError(f"request id {request.request_id} is already queued or running")
        request.state = RequestState.WAITING
        if request.arrival_s is None:
            request.arrival_s = self.clock()
        self.waiting.append(request)

    def _admit(self) -> list:
        admitted, tokens = [], 0
        while self.waiting and len(self.running) + len(admitted) < self.max_live:
            n = self.waiting[0].prompt.numel()
            if admitted and tokens + n > self.prefill_token_budget:
                break
            admitted.append(self.waiting.popleft())
            tokens += n
        return admitted

    def _emit(self, requests: list, logits: torch.Tensor) -> None:
        shared = [i for i, r in enumerate(requests) if r.sampler is None]
        ids = [0] * len(requests)
        if shared:
            rows = logits if len(shared) == len(requests) else logits[shared]
            for i, token in zip(shared, self.sampler(rows).tolist()):
                ids[i] = token
        for i, r in enumerate(requests):
            if r.sampler is not None:
                ids[i] = r.sampler(logits[i : i + 1]).item()
        now = self.clock()
        for request, token in zip(requests, ids):
            request.output.append(int(token))
            request.token_times_s.append(now)

    def _call(self, requests: list, call: Callable) -> None:
        """One batched engine call and its sampling. When it raises, the batch's state is
        dropped and each request is prefilled alone with its whole history (what it would
        have decoded from): only those whose own call raises fail."""
        try:
            self._emit(requests, call())
            return
        except Exception:
            log.warning("an engine call for %d requests failed", len(requests), exc_info=True)
        self._forget(requests)
        for r in requests:
            history = torch.cat([r.prompt, torch.tensor(r.output, dtype=torch.long)])
            try:
                self._emit([r], self.engine.prefill([r.request_id], [history]))
            except Exception as exc:
                r.error = f"{type(exc).__name__}: {exc}"
                self._forget([r])

    def _forget(self, requests: list) -> None:
        """Remove the requests' engine state, whatever of it a failed call left."""
        for r in requests:
            try:
                self.engine.remove([r.request_id])
            except Exception:  # (unknown id: there was none)
                pass

    def cancel(self, request_id: int) -> bool:
        """Drop a waiting or running request (its client left, or a stop string ended it)."""
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                r.state = RequestState.FINISHED
                return True
        r = self.running.pop(request_id, None)
        if r is not None:
            self._forget([r])
            r.state = RequestState.FINISHED
        return r is not None

    def step(self) -> list:
        """One scheduling step; returns the requests that finished in it."""
        decoding = list(self.running.values())
        admitted = self._admit()
        if admitted:
            for r in admitted:
                r.state = RequestState.RUNNING
                self.running[r.request_id] = r
            ids, prompts = [r.request_id for r in admitted], [r.prompt for r in admitted]
            self._call(admitted, lambda: self.engine.prefill(ids, prompts))
        if decoding:
            ids = [r.request_id for r in decoding]
            last = torch.tensor([r.output[-1] for r in decoding], dtype=torch.long)
            self._call(decoding, lambda: self.engine.decode(ids, last))
        if self.history:
            self.live_per_step.append(len(self.running))
        done = [r for r in self.running.values() if r.done]
        if done:
            kept = [r.request_id for r in done if r.error is None]  # (failed ones: forgotten)
            if kept:
                self.engine.remove(kept)
            for r in done:
                r.state = RequestState.FINISHED
                del self.running[r.request_id]
            if self.history:
                self.finished += done
        self.steps += 1
        return done

    def run(self, requests: list) -> list:
        """Serve `requests` to the end; returns them finished, in finishing order."""
        for r in requests:
            self.add(r)
        start = len(self.finished)
        while not self.idle:
            self.step()
        return self.finished[start:]
