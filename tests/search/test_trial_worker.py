"""A trial's process stops when the process that started it dies (a killed worker)."""

import os
import signal
import subprocess
import sys
import time

CHILD = (
    "from search.trial import stop_with_parent; stop_with_parent(0.1); "
    "import time; print('watching', flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys, time; "
    f"c = subprocess.Popen([sys.executable, '-c', {CHILD!r}], start_new_session=True); "
    "print(c.pid, flush=True); time.sleep(60)"
)


def test_a_trial_stops_with_its_killed_parent(child_env):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], env=child_env, stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == "watching\n"
        assert _alive(child)
        parent.kill()  # SIGKILL: no clean-up of its own
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the orphaned trial kept running"
    finally:
        parent.kill()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running: a zombie (dead, not yet reaped by its new parent) does not count."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
