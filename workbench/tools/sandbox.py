"""The tool loop's sandbox: run a command so that *every* process it starts can be killed, and read its output
without ever blocking (the code interpreter runs model-written code through :func:`run_guarded`).

Killing a process group is not enough for model-written code: a child that calls ``setsid()`` (or forks
twice) leaves the group, keeps running after a timeout, and keeps the output pipes open so that
``communicate()`` waits forever.  So the command runs under a small *guard* process (Linux):

* the guard marks itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): every orphaned descendant —
  detached or not — is re-parented to the guard instead of to init, so it stays in the guard's process tree;
* when the command ends, the guard kills whatever descendants are left and exits, closing the pipes;
* on a timeout or Ctrl-C, the caller kills the guard's whole tree (found through ``/proc``), descendants
  first while the guard still holds them, then the guard; the guard also dies with its parent
  (``PR_SET_PDEATHSIG``), taking its tree along.

Output is drained by reader threads into bounded buffers (a flood of output costs no memory), and after
the guard exits the readers are joined with a deadline, never unboundedly.  Elsewhere (no ``/proc``), the
command runs in its own session and the process group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_LINUX = sys.platform.startswith("linux") and Path("/proc/self/stat").exists()

# The guard (a bare interpreter: -S, no imports beyond ctypes): argv = [python, -I, -S, -c, _GUARD,
# memory_bytes_or_0, executable, args...]
_GUARD = r"""
import ctypes, os, signal, sys, time

def descendants():
    me, children = os.getpid(), {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":
                    children.setdefault(int(fields[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [me]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out

def kill_all():
    for _ in range(100):
        pids = descendants()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.01)

def on_signal(signum, frame):
    kill_all()
    os._exit(128 + signum)

try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: a dead parent means "stop everything"
except Exception:
    pass
signal.signal(signal.SIGTERM, on_signal)
if os.getppid() == 1:  # the parent died before the death signal was armed
    sys.exit(1)
limit = int(sys.argv[1])
pid = os.fork()
if pid == 0:
    try:
        if limit:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.execv(sys.argv[2], sys.argv[2:])
    except BaseException as exc:
        os.write(2, f"could not start {sys.argv[2]!r}: {exc}\n".encode())
    os._exit(127)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
kill_all()
if os.WIFSIGNALED(status):
    os.write(2, f"\n%s {os.WTERMSIG(status)}\n".encode())
    sys.exit(128 + os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


KILLED_BY = "the process was killed by signal"
_GUARD = _GUARD.replace("%s", KILLED_BY)


@dataclass
class RunResult:
    """What a guarded run produced: exit status (None when killed on timeout), captured output, cut counts."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int
    timed_out: bool


class _Drain(threading.Thread):
    """Reads a pipe to EOF, keeping the first ``cap`` bytes and counting the rest."""

    def __init__(self, stream, cap: int) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    def run(self) -> None:
        try:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    return
                room = self.cap - self.kept
                if room > 0:
                    self.chunks.append(chunk[:room])
                    self.kept += min(room, len(chunk))
                self.dropped += max(len(chunk) - max(room, 0), 0)
        except (OSError, ValueError):  # closed under us after the deadline
            return

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (Linux ``/proc``), parents before children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()  # state, ppid, ... (the name may hold ")")
        except (OSError, ValueError, IndexError):
            continue
        if fields[0] != b"Z":  # zombies are already dead: their parent reaps them
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL every descendant of ``proc`` (while ``proc``, the subreaper, still holds them), then ``proc``."""
    if _LINUX:
        for _ in range(100):  # processes forked meanwhile are re-parented to the guard: found next round
            pids = descendants(proc.pid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the guard's session (all that is left elsewhere)
    except (OSError, AttributeError):
        pass
    try:
        proc.kill()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of our own child does not fail
        pass


def run_guarded(
    argv: list[str],
    *,
    timeout: float,
    cwd: str,
    env: dict[str, str],
    output_cap: int,
    memory_bytes: int | None = None,
    drain_seconds: float = 5.0,
) -> RunResult:
    """Run ``argv`` under the guard; kill its whole tree on timeout or ``KeyboardInterrupt`` (re-raised)."""
    if _LINUX:
        cmd = [sys.executable, "-I", "-S", "-c", _GUARD, str(memory_bytes or 0), *argv]
        preexec = None
    else:
        cmd = argv
        preexec = _rlimit(memory_bytes)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec,
    )
    readers = [_Drain(proc.stdout, output_cap), _Drain(proc.stderr, output_cap)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
    except BaseException:  # Ctrl-C (or anything else) while waiting: leave nothing running
        kill_tree(proc)
        _close(proc, readers, 0.5)
        raise
    if not _LINUX:
        kill_tree(proc)  # children left in the session
    _close(proc, readers, drain_seconds)
    out, err = readers
    return RunResult(None if timed_out else proc.returncode, out.data, err.data, out.dropped, err.dropped, timed_out)


def _close(proc: subprocess.Popen, readers: list[_Drain], seconds: float) -> None:
    """Join the readers for at most ``seconds``, then close the pipes (a leftover writer cannot block us)."""
    deadline = time.monotonic() + seconds
    for reader in readers:
        reader.join(max(deadline - time.monotonic(), 0))
        if not reader.is_alive():  # a reader still blocked keeps its pipe (closing it would wait for the read)
            try:
                reader.stream.close()
            except OSError:
                pass


def _rlimit(memory_bytes: int | None):  # noqa: ANN202
    if not memory_bytes or os.name != "posix":
        return None

    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply
