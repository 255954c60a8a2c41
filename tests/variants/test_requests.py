"""Argument checks of the course interface: ids as a list, token tensors, the vocabulary range."""

import pytest
import torch

from variants.requests import as_id_list, check_token_range, check_token_tensor


def test_as_id_list_accepts_lists_tuples_and_1d_int_tensors():
    assert as_id_list([3, 10**12, 0]) == [3, 10**12, 0]
    assert as_id_list((5,)) == [5]
    assert as_id_list(torch.tensor([4, 2], dtype=torch.int32)) == [4, 2]
    assert as_id_list([]) == []
    assert all(type(r) is int for r in as_id_list(torch.tensor([1, 2])))


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1, 2, 1, 2, 3], r"duplicate request id\(s\) in one call: \[1, 2\]"),
        (torch.tensor([[1, 2]]), "must be 1-D and integer"),
        (torch.tensor([1.0, 2.0]), "must be 1-D and integer"),
    ],
)
def test_as_id_list_refuses(ids, message):
    with pytest.raises(ValueError, match=message):
        as_id_list(ids)


def test_check_token_tensor_converts_to_long_on_the_device():
    out = check_token_tensor(torch.tensor([1, 2], dtype=torch.int16), "x", torch.device("cpu"))
    assert out.dtype == torch.long and out.tolist() == [1, 2]
    assert check_token_tensor([7, 8], "x", "cpu").tolist() == [7, 8]


@pytest.mark.parametrize(
    "tokens", [torch.tensor([1.0]), torch.tensor([True]), torch.tensor([1 + 1j])]
)
def test_check_token_tensor_refuses_non_integer(tokens):
    with pytest.raises(
        ValueError, match=f"req 4: token ids must be an integer tensor, got {tokens.dtype}"
    ):
        check_token_tensor(tokens, "req 4", "cpu")


def test_check_token_range():
    check_token_range(torch.tensor([0, 255]), 256, "ok")
    with pytest.raises(
        ValueError, match=r"prefill: token id 256 is outside the vocabulary \[0, 256\)"
    ):
        check_token_range(torch.tensor([0, 256]), 256, "prefill")
    with pytest.raises(ValueError, match="token id -3 is outside"):
        check_token_range(torch.tensor([-3, 300]), 256, "decode")
