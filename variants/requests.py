"""Checks of the course interface's arguments, before any state changes.

Every problem raises with the request id and what is wrong; nothing is modified until all checks
of a call have passed, so a bad call leaves every request as it was."""

import operator

import torch

from variants.deferred_check import range_error


def as_id_list(request_ids) -> list:
    if isinstance(request_ids, torch.Tensor):
        if request_ids.dim() != 1 or request_ids.dtype.is_floating_point:
            raise ValueError("request_ids tensor must be 1-D and integer")
        request_ids = request_ids.tolist()  # ids are host bookkeeping; a GPU tensor costs a copy
    ids = []
    for r in request_ids:
        try:
            ids.append(operator.index(r))
        except TypeError:
            raise ValueError(f"request id {r!r} is not an integer") from None
    if len(set(ids)) != len(ids):
        dup = sorted({r for r in ids if ids.count(r) > 1})
        raise ValueError(f"duplicate request id(s) in one call: {dup}")
    return ids


def check_token_tensor(t, what: str, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t, dtype=torch.long)
    if t.dtype == torch.long and t.device == device:  # the usual case: nothing to convert
        return t
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{what}: token ids must be an integer tensor, got {t.dtype}")
    # non_blocking only towards the GPU: a GPU->CPU copy into pinned memory would not be waited on
    return t.to(device=device, dtype=torch.long, non_blocking=torch.device(device).type == "cuda")


def check_token_range(tokens: torch.Tensor, vocab: int, what: str) -> None:
    """One host read of min and max together; on CUDA it waits for the queue (the engine
    defers it instead where it can: DeferredRangeCheck)."""
    lo, hi = torch.stack(torch.aminmax(tokens)).tolist()
    if message := range_error(lo, hi, vocab, what):
        raise ValueError(message)


def token_ids_on_host(token_ids) -> bool:
    """Ids given as a list or a CPU tensor can be checked without waiting for the GPU."""
    return not (isinstance(token_ids, torch.Tensor) and token_ids.device.type != "cpu")
