"""The rows a correctness case checks, known before any engine runs: for each prefill or decode
call, which request's logits each returned row must hold, as a position in one request's life.

A life is a request's tokens from its prefill until it is removed or prefilled again; every row
of a life is a prefix of it, so a causal reference computes all of them in one forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    rid: int
    life: int  # index into CaseRows.lives
    position: int  # index of the row's last token in that life


@dataclass(frozen=True)
class CaseRows:
    steps: dict[int, list[Row]]  # call index -> rows in the call's order (prefill, decode)
    lives: list[torch.Tensor]  # each life's tokens, 1-D long, where the calls put them

    def history(self, row: Row) -> torch.Tensor:
        """The request's full token history when the row was returned."""
        return self.lives[row.life][: row.position + 1]


def case_rows(calls: list) -> CaseRows:
    """Walk `materialize`d calls (`("prefill", ids, tokens)`, `("decode", ids, tokens)`,
    `("remove", ids)`) and name every checked row."""
    parts: list[list[torch.Tensor]] = []  # per life, its token pieces
    lengths: list[int] = []
    live: dict[int, int] = {}  # request id -> its current life
    steps: dict[int, list[Row]] = {}
    for step, call in enumerate(calls):
        kind, ids = call[0], call[1]
        if kind == "remove":
            for rid in ids:
                del live[rid]
            continue
        rows = []
        for i, rid in enumerate(ids):
            piece = call[2][i] if kind == "prefill" else call[2][i : i + 1]
            if kind == "prefill":
                live[rid] = len(parts)
                parts.append([])
                lengths.append(0)
            life = live[rid]
            parts[life].append(piece)
            lengths[life] += len(piece)
            rows.append(Row(rid, life, lengths[life] - 1))
        steps[step] = rows
    return CaseRows(steps, [torch.cat(p) for p in parts])


def reference_rows(model, rows: CaseRows, dtype: torch.dtype = torch.float64) -> dict:
    """Call index -> the reference's logits for its rows, `[n, vocab]` on the CPU in `dtype`,
    from one forward pass per life (only the checked positions go through the head)."""
    wanted: list[list[int]] = [[] for _ in rows.lives]
    for step_rows in rows.steps.values():
        for row in step_rows:
            wanted[row.life].append(row.position)
    at: dict[tuple[int, int], torch.Tensor] = {}
    for life, tokens in enumerate(rows.lives):
        positions = sorted(set(wanted[life]))
        logits = model.forward(tokens[None], torch.tensor(positions))[0].to("cpu", dtype)
        at.update({(life, p): logits[k] for k, p in enumerate(positions)})
    return {
        step: torch.stack([at[row.life, row.position] for row in step_rows])
        for step, step_rows in rows.steps.items()
    }
