"""One engine driven by one thread: the continuous-batching scheduler runs there step after step,
while other threads (an HTTP server's handlers) `submit` requests and `cancel` them. Each step's
new tokens go back through the request's callback, called on the engine thread. Needs an engine
with the course's prefill / decode / remove; used by `python -m search serve`.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from variants.serving.scheduler import ContinuousBatchScheduler, ServingRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    """A request's tokens of one step; `finish_reason` (stop, length, error) on its last."""

    tokens: tuple
    finish_reason: str | None = None
    error: str | None = None


class EngineLoop:
    """`start`, then `submit` from any thread; `close` fails what is left and stops the thread."""

    def __init__(self, engine, max_live: int = 16, prefill_token_budget: int = 2048):
        self.scheduler = ContinuousBatchScheduler(
            engine, max_live=max_live, prefill_token_budget=prefill_token_budget, history=False
        )
        self._wake = threading.Condition()
        self._inbox: list = []  # ServingRequest to add, or a request id to cancel
        self._callbacks: dict = {}  # request id -> (callback, tokens delivered)
        self._ids = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def load(self) -> dict:
        """Requests waiting and running (read without a lock: a snapshot for /health)."""
        return {"waiting": len(self.scheduler.waiting), "running": len(self.scheduler.running)}

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def submit(
        self,
        prompt: list,
        max_new_tokens: int,
        on_tokens: Callable[[TokenEvent], None],
        eos_ids=frozenset(),
        sampler: Callable | None = None,
    ) -> int:
        """Queue a request; returns its id. `sampler` None is greedy."""
        rid = next(self._ids)
        request = ServingRequest(
            rid, torch.tensor(prompt, dtype=torch.long), max_new_tokens, frozenset(eos_ids), sampler
        )
        with self._wake:
            if self._closed:
                raise RuntimeError("the engine loop is closed")
            self._callbacks[rid] = (on_tokens, 0)
            self._inbox.append(request)
            self._wake.notify()
        return rid

    def cancel(self, request_id: int) -> None:
        """Stop a request and free its engine state; no callback follows. Unknown ids are
        ignored (it may have finished meanwhile)."""
        with self._wake:
            self._callbacks.pop(request_id, None)
            self._inbox.append(request_id)
            self._wake.notify()

    def close(self, timeout: float = 30.0) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        with torch.no_grad():  # (grad mode is per thread)
            while True:
                with self._wake:
                    while not (self._inbox or self._closed) and self.scheduler.idle:
                        self._wake.wait()
                    if self._closed:
                        break
                    inbox, self._inbox = self._inbox, []
                for item in inbox:
                    if isinstance(item, ServingRequest):
                        self.scheduler.add(item)
                    else:
                        self.scheduler.cancel(item)
                if not self.scheduler.idle:
                    self._step()
        self._fail_all("the server is shutting down")

    def _step(self) -> None:
        try:
            finished = self.scheduler.step()
        except Exception as exc:  # not one request's failure (scheduler.step isolates those)
            log.exception("a scheduling step failed; failing every request in it")
            self._fail_all(f"{type(exc).__name__}: {exc}")
            return
        for request in [*self.scheduler.running.values(), *finished]:
            self._deliver(request)

    def _deliver(self, request: ServingRequest) -> None:
        rid = request.request_id
        with self._wake:
            callback, sent = self._callbacks.get(rid, (None, 0))
            if callback is None:  # cancelled since this step began
                return
            if request.done:
                del self._callbacks[rid]
            else:
                self._callbacks[rid] = (callback, len(request.output))
        event = TokenEvent(tuple(request.output[sent:]), request.finish_reason, request.error)
        try:
            callback(event)
        except Exception:  # a handler that cannot take tokens any more: drop its request
            log.exception("the callback of request %d failed; cancelling it", rid)
            self.cancel(rid)

    def _fail_all(self, message: str) -> None:
        sched = self.scheduler
        for request in [*sched.waiting, *sched.running.values()]:
            sched.cancel(request.request_id)
            request.error = message
            self._deliver(request)
