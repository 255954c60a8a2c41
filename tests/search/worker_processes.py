"""The processes below a search process in /proc: its trials and the forkserver they fork from
(tests/search/test_postgres.py, test_workers.py)."""

import os
from pathlib import Path


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the parent's pid
            found.append(int(stat.parent.name))
    return found


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        below = children(todo.pop())
        found += below
        todo += below
    return found


def trial_logs(pid: int) -> dict[int, Path]:
    """The trial processes below `pid`: those whose output goes to a trial folder's log.txt."""
    logs = {}
    for child in descendants(pid):
        try:
            out = Path(os.readlink(f"/proc/{child}/fd/1"))
        except OSError:
            continue
        if out.name == "log.txt" and out.parent.name.startswith("trial-"):
            logs[child] = out
    return logs


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
