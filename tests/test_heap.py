"""lakeshore/heap.py: the allocator setting of the long-running processes."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

CALL = "from dreamlake.lakeshore.heap import keep_freed_memory; print(keep_freed_memory())"


def run(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CALL], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_it_is_set_on_glibc_unless_the_environment_sets_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    # glibc takes the setting; another C library (musl) has no mallopt: nothing is set
    assert run(env) == str(platform.libc_ver()[0] == "glibc")
    # an operator's own setting wins
    assert run({**env, "MALLOC_TRIM_THRESHOLD_": "131072"}) == "False"


def test_the_commands_that_run_long_set_it() -> None:
    # serve, dev, worker start, daemon start and the job processes; not the SDK
    import importlib
    from pathlib import Path

    def source(module: str) -> str:
        return Path(importlib.import_module(module).__file__ or "").read_text()

    for module in ("cli.serve", "cli.dev", "worker.child"):
        assert "keep_freed_memory()" in source(f"dreamlake.lakeshore.{module}"), module
    assert source("dreamlake.lakeshore.cli.workers").count("keep_freed_memory()") == 2
    for module in ("dispatch", "queue", "udf", "http.transport", "server"):
        assert "keep_freed_memory" not in source(f"dreamlake.lakeshore.{module}"), module
