"""Unit tests of ``objmanifest.journal``: no server, no I/O beyond the in-process store."""
