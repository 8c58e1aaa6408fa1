"""Unit tests of ``objmanifest.ops``: no server, no I/O beyond the in-process store."""
