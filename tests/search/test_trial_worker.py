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


LEAVES_A_LOCK = """
import multiprocessing, sys
from search.trial import exit_child

def child():
    global held
    held = multiprocessing.Lock()  # as a compile's worker pool leaves one
    exit_child(0)

if __name__ == "__main__":
    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(["search.trial"])
    proc = server.Process(target=child)
    proc.start()
    proc.join()
    print("exit", proc.exitcode)
"""


STOPPED_WITH_A_LOCK = """
import multiprocessing, os, signal, sys, time
from search.trial import exit_on_term

def child(ready):
    global held
    held = multiprocessing.Lock()  # as a compile's worker pool leaves one
    exit_on_term()
    ready.set()
    time.sleep(60)

if __name__ == "__main__":
    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(["search.trial"])
    ready = server.Event()
    proc = server.Process(target=child, args=(ready,))
    proc.start()
    ready.wait(30)
    os.kill(proc.pid, signal.SIGTERM)  # a trial at its limit
    proc.join(30)
    print("exit", proc.exitcode)
"""


def test_a_trial_stopped_at_its_limit_leaves_no_semaphore_to_warn_about(child_env, tmp_path):
    script = tmp_path / "stopped_with_a_lock.py"
    script.write_text(STOPPED_WITH_A_LOCK)
    done = subprocess.run(
        [sys.executable, str(script)], env=child_env, capture_output=True, text=True, timeout=90
    )
    assert done.stdout == f"exit {128 + signal.SIGTERM}\n", done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr


def test_a_forked_trials_exit_leaves_no_semaphore_for_the_job_to_warn_about(child_env, tmp_path):
    script = tmp_path / "leaves_a_lock.py"
    script.write_text(LEAVES_A_LOCK)
    done = subprocess.run(
        [sys.executable, str(script)], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "exit 0\n", done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr
