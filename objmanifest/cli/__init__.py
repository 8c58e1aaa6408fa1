"""The ``objmanifest`` command line: the Python API for shell steps, CI jobs and agents.

JSON in and out (``--json``), distinct exit codes, claims that one process makes and the
next finishes (``--agent``/``--epoch``), and a local S3 server (``serve``). See
``docs/cli.md``.
"""

from .app import main

__all__ = ["main"]
