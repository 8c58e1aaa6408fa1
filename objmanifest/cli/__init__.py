"""The ``objmanifest`` command line: the Python API for shell steps, CI jobs and agents.

JSON in and out (``--json``), distinct exit codes, claims that one process makes and the
next finishes (``--agent``/``--epoch``), and a local S3 server (``serve``). See
``docs/cli.md``.

It never changes a manifest object but through ``Task`` and ``Agent``, never shows a
credential, and never ends in a traceback: an error is one line and the exit code of the
table it shares with the other faces (``wire.exits``).
"""

from .app import main

__all__ = ["main"]
