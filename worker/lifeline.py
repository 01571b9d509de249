"""A job process's tie to its worker (Linux): it dies with the worker, and the shell
command it runs dies with it — a worker killed outright (``kill -9``) leaves nothing
running a job the plane hands to another worker once its lease runs out.

- :func:`die_with_parent`: the job process asks the kernel for SIGKILL when its parent
  goes (``prctl(PR_SET_PDEATHSIG)``), first thing as it starts, and ends itself if the
  parent went before it asked. The signal comes when the parent *thread* that started
  it ends, not the process: a worker starts its job processes from the thread that runs
  its loop, which outlives all of them (``ProcessWorker.run`` ends them before it
  returns).
- :class:`CommandGroups`: a shell command runs in a process group of its own (a cancel
  kills all of it). A watcher started with the job process (a ``/bin/sh`` of its own,
  detached, under 1 MB) hears from it which group runs now, over a pipe only the job
  process writes; once the job process is gone, whatever the reason (its worker killed,
  a crash), the pipe ends and the watcher kills that group. Nothing per job but two
  short writes for a command (none for a Python job); no ``preexec_fn`` (a job process
  may have threads, and without it the command still starts with ``vfork``).

Elsewhere than Linux both do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

__all__ = ["CommandGroups", "die_with_parent"]

_LINUX = sys.platform.startswith("linux")
#: ``<linux/prctl.h>``
_PR_SET_PDEATHSIG = 1

#: the watcher: keeps the last group it was told of (0: none) until its input ends, then
#: kills it; deaf to the signals a terminal or a supervisor sends the worker's group
_WATCHER = (
    "trap '' HUP INT TERM QUIT; g=0; while read -r n; do g=$n; done; "
    '[ "$g" = 0 ] || kill -9 "-$g" 2>/dev/null'
)
#: started from a shell that exits at once (it is nobody's child to wait for): its input
#: moves to fd 3, as an asynchronous list's stdin is /dev/null
_DETACHED = f"exec 3<&0 </dev/null; ({_WATCHER}) <&3 3<&- >/dev/null 2>&1 &"


def die_with_parent(parent: int) -> None:
    """Have this process killed when its parent (pid ``parent``) ends; end it now if that
    happened already. Linux only: elsewhere, or if the call is refused, nothing."""
    if not _LINUX:
        return
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() == parent:
        return
    # Adopted: the parent went before the signal was asked for. (A launcher between
    # the two, whose child this is, leaves the parent running: then the signal follows
    # the launcher, and this process runs on.)
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
    except PermissionError:
        pass


class CommandGroups:
    """The job process's side of the watcher that kills its running command's process
    group once the job process is gone (see the module). :meth:`watched` starts one;
    a bare instance (and any elsewhere than Linux) watches nothing."""

    def __init__(self, fd: int | None = None) -> None:
        #: the write end of the watcher's input (None: no watcher)
        self._fd = fd
        #: the group running now (0: none)
        self._group = 0

    @classmethod
    def watched(cls) -> CommandGroups:
        """Start the watcher (a bare instance if it cannot start)."""
        if not _LINUX:
            return cls()
        r, w = os.pipe()  # (neither end inheritable: commands never hold the pipe)
        try:
            subprocess.run(
                ["/bin/sh", "-c", _DETACHED],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # (not in the worker's group: its signals miss it)
                check=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            os.close(w)
            return cls()
        finally:
            os.close(r)
        return cls(w)

    def running(self, group: int) -> None:
        """A command runs in process group ``group`` now."""
        self._group = group
        self._tell(group)

    def ended(self) -> None:
        """The command has ended (nothing to kill any more)."""
        if self._group:
            self._group = 0
            self._tell(0)

    def _tell(self, group: int) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, b"%d\n" % group)
        except OSError:  # (the watcher is gone: nobody to tell)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
