"""A lineage drawn as a layered graph: the entry on the right, what it was made from in
columns to its left (a node's column is its longest path to the entry, so every edge
points rightwards), each column ordered to keep edges short. Pure: positions only; the
page draws them as SVG, each node a link to its entry's page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NODE_WIDTH = 220
NODE_HEIGHT = 40
COLUMN_GAP = 70
ROW_GAP = 16
MAX_NODES = 150
"""Nodes drawn at most (the nearest to the entry first); the rest are counted, not drawn."""


def layered(
    root: str,
    nodes: Mapping[str, Mapping[str, Any]],
    edges: Sequence[Sequence[str]],
    max_nodes: int = MAX_NODES,
) -> dict[str, Any]:
    """Positions for ``nodes`` (file id -> its lineage node) joined by ``edges`` (each a
    (file id, a dependency of it) pair): ``nodes`` with ``x``, ``y`` and ``layer``,
    ``edges`` as ``from`` (the dependency) and ``to``, the drawing's ``width`` and
    ``height``, and ``hidden``, how many nodes were left out."""
    deps: dict[str, list[str]] = {}
    for down, up in edges:
        deps.setdefault(down, [])
        if up not in deps[down]:
            deps[down].append(up)
    order = _nearest_first(root, deps)
    shown = set(order[:max_nodes])
    layer = _longest_paths(root, deps, shown)
    columns: dict[int, list[str]] = {}
    for fid in order:
        if fid in shown:
            columns.setdefault(layer[fid], []).append(fid)
    row: dict[str, float] = {root: 0.0}
    for depth in sorted(columns)[1:]:
        # Each node sits near the mean row of the nodes it feeds (one sweep from the root).
        def mean_row(fid: str) -> float:
            fed = [row[d] for d, ups in deps.items() if fid in ups and d in row]
            return sum(fed) / len(fed) if fed else 0.0

        columns[depth].sort(key=lambda fid: (mean_row(fid), fid))
        for n, fid in enumerate(columns[depth]):
            row[fid] = float(n)
    deepest = max(columns) if columns else 0
    tallest = max((len(c) for c in columns.values()), default=1)
    placed = []
    for depth, fids in sorted(columns.items()):
        offset = (tallest - len(fids)) / 2
        for n, fid in enumerate(fids):
            node = nodes.get(fid, {})
            placed.append(
                {
                    "id": fid,
                    "layer": depth,
                    "x": (deepest - depth) * (NODE_WIDTH + COLUMN_GAP),
                    "y": round((offset + n) * (NODE_HEIGHT + ROW_GAP)),
                    "state": node.get("state"),
                    "stage": node.get("stage"),
                }
            )
    drawn = [
        {"from": up, "to": down}
        for down, ups in deps.items()
        for up in ups
        if down in shown and up in shown
    ]
    return {
        "nodes": placed,
        "edges": drawn,
        "width": (deepest + 1) * NODE_WIDTH + deepest * COLUMN_GAP,
        "height": tallest * NODE_HEIGHT + (tallest - 1) * ROW_GAP,
        "node_width": NODE_WIDTH,
        "node_height": NODE_HEIGHT,
        "hidden": len(order) - len(shown),
    }


def _nearest_first(root: str, deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Every node reachable from ``root``, breadth first."""
    seen = {root}
    order = [root]
    for current in order:  # grows while it is walked
        for up in deps.get(current, ()):
            if up not in seen:
                seen.add(up)
                order.append(up)
    return order


def _longest_paths(root: str, deps: Mapping[str, Sequence[str]], shown: set[str]) -> dict[str, int]:
    """Each shown node's longest path from ``root`` through shown nodes (the index holds no
    cycle, so relaxing edges until nothing changes ends after at most len(shown) rounds)."""
    layer = {root: 0}
    for _ in range(len(shown)):
        changed = False
        for down, ups in deps.items():
            if down not in layer:
                continue
            for up in ups:
                if up in shown and layer.get(up, -1) < layer[down] + 1:
                    layer[up] = layer[down] + 1
                    changed = True
        if not changed:
            break
    return layer


__all__ = ["MAX_NODES", "layered"]
