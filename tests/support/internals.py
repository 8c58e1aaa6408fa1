"""What a test of the internals reaches past the public API for: the engine a ``Task``
holds (its documents, layout, codecs, journal). Only tests use it; the faces use the
public calls (``tests/test_architecture.py`` checks that)."""

from __future__ import annotations

import objmanifest as om
from objmanifest.engine.manifest import Manifest


def engine(holder: om.Task | om.Agent) -> Manifest:
    """The manifest engine a task (or one of its agents) holds."""
    return holder._engine
