"""Workers: run claimed invocations and report back."""

from __future__ import annotations

from .execute import Executor, Outcome
from .loop import run_worker

__all__ = ["Executor", "Outcome", "run_worker"]
