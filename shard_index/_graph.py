"""Cycle searches over the dependency graph.

Both are iterative (no recursion limit at 100k entries) and visit neighbours in sorted
order, so the cycle a user sees does not change from run to run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping

from shard_index.node import Node


def find_new_cycle(
    start: str,
    deps: Collection[str],
    dependencies: Callable[[str], Iterable[str]],
    dependents: Callable[[str], Iterable[str]],
) -> list[str] | None:
    """Return the cycle that new edges ``start -> deps`` would close, or None.

    A cycle exists iff some dependency reaches ``start``. Searching forward from the
    dependencies and backward from ``start`` at once, always growing the side that has
    seen less, bounds the work by the smaller of the two regions: a long chain costs O(1)
    per entry whichever end it is declared from.
    """
    if start in deps:
        return [start]
    # Nothing waits for start yet (the usual case when dependencies are declared first):
    # no path can lead back to it.
    if not deps or next(iter(dependents(start)), None) is None:
        return None
    # forward[x]: the node that depends on x, one step closer to start (edges point forward).
    forward: dict[str, str] = {}
    # backward[x]: the node x depends on, one step closer to start.
    backward: dict[str, str] = {start: start}
    forward_queue: deque[str] = deque()
    for dep in sorted(deps):
        forward[dep] = start
        forward_queue.append(dep)
    backward_queue: deque[str] = deque([start])
    while forward_queue and backward_queue:
        if len(forward) < len(backward):
            node = forward_queue.popleft()
            for nxt in sorted(dependencies(node)):
                if nxt in backward:
                    return _join(start, forward, backward, node, nxt)
                if nxt not in forward:
                    forward[nxt] = node
                    forward_queue.append(nxt)
        else:
            node = backward_queue.popleft()
            for prev in sorted(dependents(node)):
                if prev in forward:
                    return _join(start, forward, backward, prev, node)
                if prev not in backward:
                    backward[prev] = node
                    backward_queue.append(prev)
    # One side is exhausted without meeting the other, so no dependency reaches start.
    return None


def _join(
    start: str,
    forward: Mapping[str, str],
    backward: Mapping[str, str],
    last_forward: str,
    first_backward: str,
) -> list[str]:
    """Splice the two search trees at the edge ``last_forward -> first_backward``."""
    head = [last_forward]
    while forward[head[-1]] != start:
        head.append(forward[head[-1]])
    head.append(start)
    head.reverse()
    node = first_backward
    while node != start:
        head.append(node)
        node = backward[node]
    return head


def find_any_cycle(
    nodes: Mapping[str, Node], dependents: Mapping[str, Iterable[str]]
) -> list[str] | None:
    """Return some cycle among declared entries, or None (Kahn's algorithm, O(V + E)).

    Used to check an index read from storage, which nobody validated on the way in.
    """
    waiting = {
        file_id: sum(1 for dep in node.depends_on if dep in nodes)
        for file_id, node in nodes.items()
    }
    ready = [file_id for file_id, count in waiting.items() if count == 0]
    done = 0
    while ready:
        file_id = ready.pop()
        done += 1
        for dependent in dependents.get(file_id, ()):
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    if done == len(nodes):
        return None
    # Every entry left over waits for another left-over entry, so following any of them
    # must come back to an entry already on the path.
    stuck = {file_id for file_id, count in waiting.items() if count > 0}
    path: list[str] = []
    position: dict[str, int] = {}
    node_id = min(stuck)
    while node_id not in position:
        position[node_id] = len(path)
        path.append(node_id)
        node_id = min(dep for dep in nodes[node_id].depends_on if dep in stuck)
    return path[position[node_id] :]
