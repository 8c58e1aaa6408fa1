"""Pages that are documents at the repository root (ARCHITECTURE.md, BENCHMARKS.md,
RELIABILITY.md): a page holding ``<!-- include: NAME.md -->`` gets that file's text.

The root files stay where readers of the repository look for them, and their links stay
relative to the root (BENCHMARKS.md shows ``docs/bench_*.png``). So the included text has
its links rewritten for the page: to the site's own copy of a root document, to an image
in docs/ by its name there, and any other repository path (``tests/chaos/README.md``) to
the path in code, since the site does not hold it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!-- include: ([A-Z]+\.md) -->$", re.M)
PAGES = {
    "README.md": "index.md",
    "ARCHITECTURE.md": "architecture.md",
    "BENCHMARKS.md": "benchmarks.md",
    "RELIABILITY.md": "reliability.md",
}
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def relink(match: re.Match[str]) -> str:
    bang, text, target = match.groups()
    path, _, anchor = target.partition("#")
    if re.match(r"[a-z]+:", target) or not path:  # a URL, or an anchor on the same page
        return match.group(0)
    if path in PAGES:
        return f"{bang}[{text}]({PAGES[path]}{'#' + anchor if anchor else ''})"
    if path.startswith("docs/"):
        return f"{bang}[{text}]({path.removeprefix('docs/')})"
    if text.strip("`") == path:
        return f"`{path}`"
    return f"{text} (`{path}`)"


def include(match: re.Match[str]) -> str:
    return LINK.sub(relink, (ROOT / match.group(1)).read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return INCLUDE.sub(include, markdown)
