"""Errors of the local tooling: servers started for tests and the demo, and stopping on a
signal."""

from __future__ import annotations

from ..errors import ObjManifestError


class LocalServerError(ObjManifestError):
    """A local S3 server (moto or SeaweedFS) could not be started or stopped."""


class ServerExitedEarly(LocalServerError):
    """A local server's process exited before it became ready."""


class SetupError(ObjManifestError):
    """The demo could not start: no server, no bucket, no task."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP: stop like on Ctrl-C, leaving no agent or server behind. A
    BaseException, like KeyboardInterrupt, so no `except Exception` on the way swallows it."""
