"""Unit tests of ``objmanifest.data``: no server, no I/O beyond the in-process store."""
