"""The docs stay what a reader reads at once (issue #41): the README one screen or two, PERF one
page of current numbers, the architecture on a page or two; the history is in git."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("path", "most"), [("README.md", 150), ("docs/PERF.md", 500), ("docs/ARCHITECTURE.md", 150)]
)
def test_a_doc_stays_within_its_lines(path, most):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= most, f"{path} has {lines} lines (at most {most}: the history goes to git)"
