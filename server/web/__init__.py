"""The web page served at ``/``: static files only (HTML, CSS and plain JavaScript; no build step)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC"]

STATIC = Path(__file__).parent / "static"
