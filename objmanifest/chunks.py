"""Deprecated: chunked entries now live in ``objmanifest.uploads``.

``objmanifest.chunks.sweep(task)`` keeps working and says what to use instead:
``task.sweep_uploads()``.
"""

from __future__ import annotations

import warnings

from .manifest import Manifest


def sweep(task: Manifest) -> list[str]:
    """Deprecated: use ``task.sweep_uploads()``."""
    warnings.warn(
        "objmanifest.chunks.sweep(task) is deprecated: use task.sweep_uploads()",
        DeprecationWarning,
        stacklevel=2,
    )
    return task.sweep_uploads()
