"""Captures run with the cyclic collector off (and, at creation, dead cycles collected first)."""

import gc

from variants.execution.cuda_graphs import no_collection


class _Cycle:
    def __init__(self, freed: list):
        self.me, self.freed = self, freed

    def __del__(self):
        self.freed.append(True)


def test_dead_cycles_go_before_the_block_and_none_during_it():
    freed: list = []
    _Cycle(freed)  # dead, but only the cyclic collector frees it
    with no_collection():
        assert freed == [True] and not gc.isenabled()
        _Cycle(freed)
        garbage = [_Cycle([]) for _ in range(10_000)]  # enough to set off a collection
        del garbage
        assert freed == [True]
    assert gc.isenabled()
    gc.collect()
    assert freed == [True, True]


def test_the_collector_stays_off_if_it_was_off():
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_capture_inside_a_call_collects_nothing_first():
    freed: list = []
    _Cycle(freed)
    with no_collection(collect=False):
        assert freed == [] and not gc.isenabled()
    assert gc.isenabled()
    gc.collect()
    assert freed == [True]
