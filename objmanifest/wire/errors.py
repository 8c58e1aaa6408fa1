"""Outcomes of the faces (command line and MCP server) that are not errors of the library:
a usage error, nothing to claim, a stage not all ready, an optional extra missing."""

from __future__ import annotations

from ..errors import InvalidInput, ObjManifestError


class UsageError(InvalidInput):
    """The command line is wrong; ``usage`` names the (sub)command for the usage hint."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


class NothingClaimable(ObjManifestError):
    """``claim --stage`` found no entry it could take (possibly after ``--wait``)."""


class NotAllReady(ObjManifestError):
    """``put-many`` made some files ready and not others, which failed in different ways
    (each failure is reported with its file)."""


class ExtraMissing(ObjManifestError):
    """A command needs an optional extra that is not installed (``objmanifest web`` needs
    ``objmanifest[web]``); the message names it and how to install it."""
