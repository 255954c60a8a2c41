"""The token-range check read after the call's kernels are queued."""

import pytest
import torch

from variants.deferred_check import DeferredRangeCheck, graph_events, range_error


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


def test_a_check_may_sit_in_a_graph_where_the_events_allow_it():
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 11):  # seen in 2.11 (the H200) and 2.13 (CI)
        assert graph_events()
    assert DeferredRangeCheck(torch.device("cpu")).in_graph is False
    assert DeferredRangeCheck(torch.device("cpu"), in_graph=True).in_graph is True


def _copy_check(check, tokens, host, meta, table):  # torch's min/max, a copy node, the event
    check.start(tokens)


def _kernel_check(check, tokens, host, meta, table):
    """The Triton stacks' graphs: one kernel (prompt_gather.py) gathers the ids from where they
    are, writes their extremes into pinned memory and embeds them clamped, then the event."""
    from variants.kernels.prompt_gather import gathered_embedding

    return gathered_embedding(check, host, meta, tokens, tokens.numel(), 1, 2, 256, table)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("queue", [_copy_check, _kernel_check], ids=["copy", "kernel"])
def test_a_check_inside_a_graph_is_read_before_the_graph_ends(queue):
    """Captured into a graph that then sleeps ~50 ms: each replay's answer is its own, and is
    read while the graph is still running (the event is a node of the graph). The kernel also
    embeds the ids clamped."""
    device = torch.device("cuda")
    check = DeferredRangeCheck(device, in_graph=True)
    assert check.in_graph
    tokens = torch.zeros(8, dtype=torch.long, device=device)
    # the kernel's pinned buffer: metadata [0], the token count at 1, each row's source from 2
    # (0: row r's id is tokens[r])
    host = torch.tensor([0, 8] + [0] * 8, dtype=torch.long).pin_memory()
    meta = torch.zeros(1, dtype=torch.long, device=device)
    table = torch.arange(256 * 4, device=device, dtype=torch.float16).view(256, 4)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        embedded = queue(check, tokens, host, meta, table)
        torch.cuda._sleep(100_000_000)  # cycles: about 50 ms at the H200's 1.98 GHz
    torch.cuda.synchronize(device)
    finished = torch.cuda.Event()
    for ids, want in (([3] * 8, None), ([5, 300] + [0] * 6, 300), ([-2] + [9] * 7, -2)):
        tokens.copy_(torch.tensor(ids, device=device))
        graph.replay()
        finished.record()
        message = check.error(256, "decode")
        assert not finished.query()  # the graph is still sleeping
        assert message is None if want is None else f"token id {want} is outside" in message
        torch.cuda.synchronize(device)
        if embedded is not None:
            assert torch.equal(embedded, table[[min(max(i, 0), 255) for i in ids]])
