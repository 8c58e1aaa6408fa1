"""``python -m objmanifest``: the command line."""

from objmanifest.cli import main

raise SystemExit(main())
