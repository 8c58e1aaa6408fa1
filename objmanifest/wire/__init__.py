"""What the faces say on the wire: the JSON shapes of entries, claims, status and errors,
and the one table of error names and exit codes that the command line, the MCP server and
the web API share, so the three cannot drift apart.

It uses the public API only and never prints or serves anything itself.
"""
