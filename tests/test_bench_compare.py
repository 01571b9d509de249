"""The side-by-side harness keeps working: its Lakeshore systems, tiny sizes, one run.

``benchmarks/compare.py --quick`` runs as a subprocess against the embedded planes,
``lakeshore serve`` and ``lakeshore dev`` (loopback only, no Redis, no peers' venv). The
test checks that every workload ran, checked its results and reported its figures; it
asserts nothing about how fast they were.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(90)

EXPECTED = {
    "ls-memory": {"B": ["p50_ms", "p99_ms"], "C": ["ms"]},
    "ls-file": {"B": ["p50_ms", "p99_ms"], "C": ["ms"], "A": ["jobs_per_s", "cpu_ms_per_job"]},
    "ls-serve": {
        "B": ["p50_ms", "p99_ms"],
        "C": ["ms"],
        "RT": ["round_trips", "requests"],
        "A": ["jobs_per_s", "cpu_ms_per_job"],
        "D": ["seconds"],
    },
    "ls-dev": {"E": ["jobs_per_s", "http_requests_per_job"]},
}


def test_the_harness_runs_every_lakeshore_workload_and_writes_its_report(tmp_path: Path) -> None:
    # Given the harness on the Lakeshore systems only, with tiny sizes
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare.py"),
            "--quick",
            "--runs", "1",
            "--systems", ",".join(EXPECTED),
            "--d-cap", "30",
            "--out", str(out),
        ],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    # Then it succeeds: every workload ran and its results were right
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    for system, workloads in EXPECTED.items():
        got = run["results"][system]
        assert set(got) == set(workloads), (system, got)
        for workload, keys in workloads.items():
            figures = got[workload]
            assert "error" not in figures and "capped" not in figures, (system, figures)
            for key in keys:
                assert key in figures, (system, workload, key, figures)
    # and one B call over serve costs a countable number of HTTP requests
    assert run["results"]["ls-serve"]["RT"]["round_trips"] >= 1
    # and the report is a markdown table with a row per workload
    for row in ("B p50 (ms)", "A jobs/s", "C 1 MiB (ms)", "D 20 ms RTT (s)", "E jobs/s (dev)"):
        assert f"| {row} |" in proc.stdout, proc.stdout


def test_the_hand_off_benchmark_runs_both_cases_on_one_cpu_and_on_all() -> None:
    # Given benchmarks/handoff.py with tiny sizes (its embedded case checks each result)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "handoff.py"), "--runs", "1", "--calls", "20"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    # Then it succeeds and reports a row for each case, each with both figures
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if "|" in line}
    for case in ("pingpong", "embedded"):
        cells = [c.strip() for c in rows[case].split("|")[2:4]]
        assert all(float(c) > 0 for c in cells), rows[case]
