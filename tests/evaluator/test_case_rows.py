"""The rows a case checks: named before any engine runs, one reference pass per request life."""

import torch

from evaluator.case_rows import Row, case_rows, reference_rows
from evaluator.correctness_traces import public_correctness
from evaluator.reference_model import ReferenceModel
from evaluator.traces import Decode, Prefill, Remove, Trace, materialize


def test_public_rows_and_lives(tiny_config):
    calls = materialize(public_correctness(), tiny_config["vocab_size"], "cpu", seed=7)
    rows = case_rows(calls)
    assert [len(life) for life in rows.lives] == [14, 8, 15, 6]
    assert rows.steps == {
        0: [Row(0, 0, 10)],
        1: [Row(0, 0, 11)],
        2: [Row(1, 1, 6), Row(2, 2, 12)],
        3: [Row(0, 0, 12), Row(1, 1, 7), Row(2, 2, 13)],
        5: [Row(3, 3, 4)],
        6: [Row(0, 0, 13), Row(2, 2, 14), Row(3, 3, 5)],
    }
    # The history of a row is the prompt plus the decoded tokens so far.
    prompt, first_decode = calls[0][2][0], calls[1][2]
    assert torch.equal(rows.history(Row(0, 0, 11)), torch.cat([prompt, first_decode]))


def test_a_reprefill_starts_a_new_life():
    trace = Trace(
        "t", (Prefill([5], [4]), Decode([5]), Prefill([5], [2]), Decode([5]), Remove([5]))
    )
    rows = case_rows(materialize(trace, 50, "cpu", seed=1))
    assert [len(life) for life in rows.lives] == [5, 3]
    assert rows.steps[2] == [Row(5, 1, 1)] and rows.steps[3] == [Row(5, 1, 2)]


def test_reference_rows_equal_each_history_alone(tiny_config, sharp_weights):
    calls = materialize(public_correctness(), tiny_config["vocab_size"], "cpu", seed=7)
    rows = case_rows(calls)
    model = ReferenceModel(tiny_config, sharp_weights, dtype=torch.float64)
    got = reference_rows(model, rows)
    assert sorted(got) == [0, 1, 2, 3, 5, 6]
    for step, step_rows in rows.steps.items():
        assert got[step].shape == (len(step_rows), 256) and got[step].dtype == torch.float64
        for i, row in enumerate(step_rows):
            alone = model.forward(rows.history(row)[None])[0, -1]
            assert (got[step][i] - alone).abs().max().item() < 1e-10
