"""Suffix attention: the queries of tokens start..n-1 over keys 0..n-1 give the last rows of the
whole prompt's causal attention (GQA included); a wrong offset does not."""

import pytest
import torch

from variants.attention.suffix import suffix_attention


@pytest.mark.parametrize("n, start", [(1, 0), (19, 0), (19, 16), (19, 18), (40, 32), (40, 7)])
def test_suffix_rows_equal_the_whole_prompt_causal_attention(attention_alone, n, start):
    gen = torch.Generator().manual_seed(n + start)
    q, k, v = (torch.randn(n, heads, 24, generator=gen) * 3.0 for heads in (4, 2, 2))
    whole = attention_alone(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), True)
    out = suffix_attention(q[start:], k, v, start)
    assert out.shape == (n - start, 4 * 24)
    torch.testing.assert_close(out, whole[start:], atol=1e-5, rtol=1e-5)
    if start:  # the queries placed at 0..m-1 see too few keys
        assert (suffix_attention(q[start:], k, v, 0) - whole[start:]).abs().max() > 0.1
