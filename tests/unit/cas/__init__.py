"""Unit tests of ``objmanifest.cas``: no server, no I/O beyond the in-process store."""
