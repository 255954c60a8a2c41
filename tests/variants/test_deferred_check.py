"""The token-range check read after the call's kernels are queued."""

import torch

from variants.deferred_check import DeferredRangeCheck, range_error


def test_range_error_names_the_first_bad_end():
    assert range_error(0, 255, 256, "decode") is None
    assert range_error(-3, 300, 256, "decode") == (
        "decode: token id -3 is outside the vocabulary [0, 256)"
    )
    assert range_error(4, 256, 256, "prefill of [1]") == (
        "prefill of [1]: token id 256 is outside the vocabulary [0, 256)"
    )


def test_each_check_reports_its_own_tokens():
    check = DeferredRangeCheck(torch.device("cpu"))
    check.start(torch.tensor([5, 0, 255]))
    assert check.error(256, "decode") is None
    check.start(torch.tensor([7, 256, 3]))
    assert check.error(256, "decode") == "decode: token id 256 is outside the vocabulary [0, 256)"
    check.start(torch.tensor([-1]))
    assert "token id -1" in check.error(256, "decode")
    check.start(torch.tensor([9]))
    assert check.error(256, "decode") is None
