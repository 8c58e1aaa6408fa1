"""The manifest engine under ``Task`` and ``Agent``: opening and creating a task, reads,
declaring, status and waiting, and the operations wired to commit events.

The public face composes it; faces above (cli, web, mcp) never reach into it.
"""
