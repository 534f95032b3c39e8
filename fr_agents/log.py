"""Project logging: one rich handler on the ``fr_agents`` logger family.

Library code calls ``logging.getLogger(__name__)`` and never prints. The CLI calls
:func:`setup_logging` once.
"""

from __future__ import annotations

import logging
import os

_CONFIGURED = False


def setup_logging(level: str | int | None = None) -> None:
    """Attach a rich handler to the root logger (idempotent). ``FR_AGENTS_LOG`` sets the level."""
    global _CONFIGURED
    if _CONFIGURED:
        return
    level = level or os.environ.get("FR_AGENTS_LOG", "INFO")
    try:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(rich_tracebacks=True, show_path=False, markup=False)
        fmt = "%(message)s"
    except ImportError:  # pragma: no cover - rich is a core dependency
        handler = logging.StreamHandler()
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, datefmt="[%X]", handlers=[handler])
    for noisy in ("httpx", "urllib3", "filelock", "docker", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _CONFIGURED = True
