"""Sampling on [B, vocab] logits: greedy, temperature, top-k, top-p and seeded replay."""

import pytest
import torch

from variants.serving.sampling import (
    SamplingParams,
    TokenSampler,
    greedy_tokens,
    sample_tokens,
    top_k_filter,
    top_p_filter,
)


def _logits(batch=4, vocab=50, seed=0):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_the_argmax_and_the_lowest_id_on_a_tie():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, -1.0]])
    assert greedy_tokens(logits).tolist() == [1, 0]
    assert sample_tokens(logits, SamplingParams()).tolist() == [1, 0]


def test_top_k_of_one_equals_greedy_at_any_temperature():
    logits = _logits()
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        ids = sample_tokens(logits, SamplingParams(temperature=2.0, top_k=1), gen)
        assert torch.equal(ids, greedy_tokens(logits))


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]])
    kept = torch.isfinite(top_k_filter(logits, 2))
    assert kept.tolist() == [[False, True, True, False, False]]
    assert torch.equal(top_k_filter(logits, 0), logits)  # off


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert kept(0.5) == [True, False, False, False]  # 0.5 reaches 0.5 alone
    assert kept(0.51) == [True, False, True, False]  # 0.5 + 0.3
    assert kept(0.8) == [True, False, True, False]  # exactly 0.8 reached: stop
    assert kept(0.81) == [True, False, True, True]
    assert kept(0.01) == [True, False, False, False]  # the top token always stays
    assert kept(1.0) == [True, True, True, True]


def test_top_p_samples_only_inside_the_nucleus():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]]).repeat(500, 1)
    ids = sample_tokens(probs.log(), SamplingParams(temperature=1.0, top_p=0.7), torch.Generator())
    assert set(ids.tolist()) == {0, 2}


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).repeat(4000, 1)
    share = lambda t: (
        (
            sample_tokens(logits, SamplingParams(temperature=t), torch.Generator().manual_seed(0))
            == 0
        )
        .float()
        .mean()
        .item()
    )
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), 0)[0].item()  # 0.665
    assert share(1.0) == pytest.approx(expected, abs=0.03)
    assert share(0.1) > 0.99 and share(10.0) < 0.45


def test_same_seed_same_samples_other_seed_other_samples():
    logits = _logits(batch=64, vocab=100)
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.95)
    a, b, c = (
        TokenSampler(params, seed=7),
        TokenSampler(params, seed=7),
        TokenSampler(params, seed=8),
    )
    torch.manual_seed(123)  # the global generator does not matter
    first = [a(logits) for _ in range(3)]
    torch.rand(10)
    assert all(torch.equal(x, b(logits)) for x in first)
    assert not torch.equal(first[0], c(logits))
    assert first[0].dtype == torch.int64 and first[0].shape == (64,)


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        greedy_tokens(torch.zeros(5))
