"""``objmanifest mcp``: the manifest as Model Context Protocol tools for LLM agents.

``tools.py`` is what the tools do (a ``Session``: one agent's claims, leases renewed in the
background, paths confined to a root, bounded holds and inline content), and knows nothing
of MCP, so it is tested without a client; ``server.py`` wires it to the ``mcp`` SDK (the
optional extra ``objmanifest[mcp]``), and is imported only by ``objmanifest mcp``.

A model never sees an epoch, and the tools never read or write a path outside their root
nor answer a call with a crash: each is a result or a tool error.
"""
