"""Outcomes of the data path that decide between adopting and restarting an upload; never
shown to a user."""

from __future__ import annotations


class RestartUpload(Exception):
    """The recorded upload cannot be finished as it is: start a new one at a new key."""


class PartDiffers(Exception):
    """A part of the source differs from the recorded part (while verifying an object)."""
