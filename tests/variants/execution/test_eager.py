"""Eager execution wraps nothing."""

from variants.execution.eager import run_eager
from variants.variant import Variant


def test_eager_returns_the_function_itself():
    def fn(x):
        return x + 1

    assert run_eager(fn, Variant()) is fn
