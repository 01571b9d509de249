"""``python -m dreamlake.lakeshore.cli`` is the ``lakeshore`` command."""

from __future__ import annotations

from . import main

main()
