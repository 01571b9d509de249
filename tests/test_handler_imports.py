"""The Lambda handler module stays lean: no CLI, HTTP client or test libraries at import,
and its cold import time is measured (reported with -s)."""

from __future__ import annotations

import json
import subprocess
import sys

CODE = """
import json, sys, time
t0 = time.perf_counter()
import dreamlake.lakeshore.handlers.api
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "modules": sorted(sys.modules)}))
"""


def test_handler_import_pulls_in_no_cli_http_client_or_test_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(proc.stdout)
    roots = {m.split(".")[0] for m in report["modules"]}
    assert not roots & {"typer", "click", "httpx", "moto", "pytest", "uvicorn", "rich"}
    print(f"cold import of the handler module: {report['seconds'] * 1000:.0f} ms")
