"""Unit tests of ``objmanifest.core``: no server, no I/O beyond the in-process store."""
