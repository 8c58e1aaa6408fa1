"""Outcomes of the data path that decide between adopting and restarting an upload, and a
download's seal refused; never shown to a user as they are."""

from __future__ import annotations


class RestartUpload(Exception):
    """The recorded upload cannot be finished as it is: start a new one at a new key."""


class PartDiffers(Exception):
    """A part of the source differs from the recorded part (while verifying an object)."""


class SealRefused(Exception):
    """The seal a download runs once the bytes are verified, before it puts them at their
    destination (a consume's mark), raised ``error``: carried past the download's own
    handlers, the destination left as it was."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
