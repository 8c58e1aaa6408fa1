"""The manifest engine under ``Task`` and ``Agent``: opening and creating a task, reads,
declaring, status and waiting, and the operations wired to commit events.

The public face composes it; faces above (cli, web, mcp) never reach into it. It never
holds an agent's identity (that is ``Agent``'s) and never builds or parses a key itself
(that is ``core.layout``'s).
"""
