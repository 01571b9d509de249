"""The web dashboard: static pages served by the API itself, and what they need from
the plane that the core does not keep — per-minute statistics read back from the store
(:mod:`.stats`) and the paused flag of a queue (:mod:`.flags`).

The pages (``static/``) are plain HTML, CSS and JavaScript with hand-drawn SVG charts:
no build step, no CDN. Every figure they show comes from API v1 with the bearer token
the login form keeps in the browser's ``sessionStorage``.
"""

from __future__ import annotations

from .assets import asset
from .flags import PauseFlags
from .stats import queue_stats
from .summary import call_summary

__all__ = ["PauseFlags", "asset", "call_summary", "queue_stats"]
