"""The manifest engine under ``Task`` and ``Agent``: ``manifest.Manifest`` holds a task's
state and the reads every other module starts from; ``opening``, ``reads``, ``declaring``,
``status``, ``journaling``, ``operations``, ``producing`` and ``consuming`` are functions
over it (none imports one that imports it back).

``Task`` and ``Agent`` hold a ``Manifest`` and offer the documented calls; the faces above
them (aio, cli, web, mcp, demo) never reach into it. It never holds an agent's identity
(that is ``Agent``'s) and never builds or parses a key itself (that is ``core.layout``'s).
"""
