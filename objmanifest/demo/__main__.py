"""``python -m objmanifest.demo``: the demo without the full command line."""

from __future__ import annotations

import sys

from . import main, parser

if __name__ == "__main__":
    sys.exit(main(parser().parse_args()))
