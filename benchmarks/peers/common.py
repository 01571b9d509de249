"""Standard-library tools shared by ``compare.py`` and the peers' producer.

Both the project's venv and the peers' venv import this module (by path), so it uses
nothing outside the standard library.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime + cutime + cstime in ticks) of a live process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after the last ')'
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def _tree(roots: Iterable[int]) -> set[int]:
    """The roots and all their live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def cpu_snapshot(alone: Iterable[int], trees: Iterable[int]) -> dict[int, int]:
    """CPU ticks by pid: ``alone`` counted without their children, ``trees`` with them.

    A child's ticks move to its parent's cutime/cstime when it is reaped, so summing
    utime + stime + cutime + cstime over a tree keeps the total of children that exited.
    """
    pids = set(alone) | _tree(trees)
    out = {}
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            out[pid] = st[1]
    return out


def cpu_seconds(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between two snapshots (processes born in between count from 0)."""
    return sum(t - before.get(pid, 0) for pid, t in after.items()) / TICK


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.02)


def wait_lines(
    path: Path,
    needle: str,
    count: int,
    timeout: float,
    proc_alive: Callable[[], bool] | None = None,
) -> None:
    """Wait until ``path`` holds ``count`` lines containing ``needle`` (a process's log)."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text(errors="replace") if path.exists() else ""
        if text.count(needle) >= count:
            return
        if proc_alive is not None and not proc_alive():
            raise RuntimeError(f"process exited before it was ready:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"not ready after {timeout} s ({needle!r} x{count}):\n{text[-3000:]}"
            )
        time.sleep(0.05)
