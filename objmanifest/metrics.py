"""Prometheus metrics of a task, fed by its commit events and read from its shards.

``register(task)`` subscribes a ``TaskMetrics`` to the task's commit events and adds it to
a registry (a new one by default; ``prometheus_client.REGISTRY`` for a process that already
runs an exporter). ``asgi_app(registry)`` serves a registry at ``/metrics`` (the web status
page mounts it). Every name starts with ``objmanifest_``; ``docs/operations.md`` lists them.

* Counters from commit events (only commits made through this process's ``Task`` object):
  commits by command, entry retries by command (``fail``, a takeover, a reaped lease, bad
  data), takeovers, reaps, deaths, data bytes made ready (``up``) and consumed (``down``);
  and a histogram of commit latency by command (``CommitEvent.seconds``).
* Counters from the CAS loop's own counts (``Documents.stats``): lost races (conflicts),
  lost answers, writes, grouped commits, reads and 304s.
* Gauges read from the shards by ``task.status()`` when scraped, cached for
  ``cache_seconds``: entries per stage and state, the entries late, overdue, blocked, dead
  and backing off per stage, and the races lost per commit lately per stage (any agent's).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .core.commit_events import CommitEvent
from .core.report import TaskStatus
from .core.states import State
from .task import Task

PREFIX = "objmanifest_"

RETRIED = {State.failed.value, State.dead.value}
"""States a failure leaves an entry in (a takeover leaves it writing, at a higher count)."""
CLAIMS = {"claim", "claim_many"}
"""Commands whose change of a writing entry is a takeover (one retry spent)."""
FAILURES = {"fail", "reap", "mismatch"}
"""Other commands that spend a retry (``release`` and ``revive`` do not)."""
FINISHES = {"finish", "finish_many"}
"""Commands that make data ready: its bytes went up."""

COMMIT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Upper bounds (seconds) of ``objmanifest_commit_seconds``: from a warm, uncontended PUT to
a local server (about 1 ms) to a commit that waited out many lost races against a distant
store (tens of seconds); slower ones fall in ``+Inf``."""

STATS = (
    ("conflicts", "lost races of the CAS loop (a 412 on a conditional write)"),
    ("lost_responses", "writes whose answer was lost (the re-read decided the outcome)"),
    ("writes", "writes of manifest objects that landed (one per PUT)"),
    ("grouped", "commits that landed in another commit's write (group commits)"),
    ("reads", "reads of manifest objects"),
    ("not_modified", "reads answered 304 Not Modified"),
)
"""The CAS loop's counts exposed as ``objmanifest_cas_NAME_total``."""

NOTES = ("late", "overdue", "blocked", "dead", "backing_off")
"""The status lists exposed as ``objmanifest_attention_entries{kind=...}``."""


class TaskMetrics(Collector):
    """The metrics of one task, as a prometheus collector; ``observe`` is its commit
    observer. Safe to call from any thread."""

    def __init__(
        self,
        task: Task,
        cache_seconds: float = 15.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.task = task
        self.cache_seconds = cache_seconds
        self._clock = clock or task.store.runtime.monotonic
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[str, ...]], float] = {}
        self._latency: dict[str, tuple[list[int], float]] = {}
        """Command -> (commits per bucket of ``COMMIT_BUCKETS`` and +Inf, not cumulative;
        the sum of their seconds)."""
        self._status: TaskStatus | None = None
        self._status_at = 0.0
        self.registry: CollectorRegistry | None = None
        """The registry ``register`` added these metrics to."""
        self._unsubscribe: Callable[[], None] | None = None

    def stop(self) -> None:
        """Stop counting commits and leave the registry."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.registry is not None:
            self.registry.unregister(self)
            self.registry = None

    # -- from commit events ---------------------------------------------------------------

    def _add(self, name: str, labels: tuple[str, ...], n: float = 1) -> None:
        key = (name, labels)
        self._counts[key] = self._counts.get(key, 0) + n

    def observe(self, event: CommitEvent) -> None:
        """Count one landed commit and what it changed."""
        command = event.command
        with self._lock:
            self._add("commits", (command,))
            counts, total = self._latency.get(command) or ([0] * (len(COMMIT_BUCKETS) + 1), 0.0)
            counts[bisect.bisect_left(COMMIT_BUCKETS, event.seconds)] += 1
            self._latency[command] = (counts, total + event.seconds)
            for change in event.transitions:
                before, after = change.before, change.after
                if command in CLAIMS and before == State.writing.value:
                    self._add("takeovers", ())
                    self._add("retries", (command,))
                elif command in FAILURES and after in RETRIED and before != after:
                    self._add("retries", (command,))
                if command == "reap" and before == State.writing.value:
                    self._add("reaps", ())
                if after == State.dead.value and before != after:
                    self._add("deaths", (command,))
                if change.size is not None:
                    if command in FINISHES and after == State.ready.value:
                        self._add("bytes", ("up",), change.size)
                    elif command == "consume":
                        self._add("bytes", ("down",), change.size)

    def count(self, name: str, *labels: str) -> float:
        """The value of one event counter (for tests and the demo)."""
        with self._lock:
            return self._counts.get((name, labels), 0)

    # -- the collector ------------------------------------------------------------------

    def status(self) -> TaskStatus:
        """The task's status, read at most every ``cache_seconds``."""
        with self._lock:
            fresh = self._status is not None and (
                self._clock() - self._status_at < self.cache_seconds
            )
            if fresh:
                assert self._status is not None
                return self._status
        status = self.task.status()
        with self._lock:
            self._status, self._status_at = status, self._clock()
        return status

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: registering must not read the store

    def collect(self) -> Iterator[Metric]:
        task_id = self.task.task_id
        status = self.status()  # first: the reads it makes are in this scrape's counts
        with self._lock:
            counts = dict(self._counts)
            latency = {c: (list(n), total) for c, (n, total) in self._latency.items()}
        families: dict[str, tuple[str, list[str]]] = {
            "commits": ("commits that landed, by command", ["command"]),
            "retries": (
                "entry retries spent (failures), by the command that spent them",
                ["command"],
            ),
            "takeovers": ("expired leases taken over by a claim", []),
            "reaps": ("expired leases released by reap", []),
            "deaths": ("entries that became dead, by command", ["command"]),
            "bytes": ("data bytes made ready (up) and consumed (down)", ["direction"]),
        }
        for name, (doc, labels) in families.items():
            family = CounterMetricFamily(f"{PREFIX}{name}", doc, labels=["task", *labels])
            for (counted, values), value in sorted(counts.items()):
                if counted == name:
                    family.add_metric([task_id, *values], value)
            yield family
        yield _histogram(task_id, latency)
        requests = self.task.request_counts()
        for name, doc in STATS:
            family = CounterMetricFamily(f"{PREFIX}cas_{name}", doc, labels=["task"])
            family.add_metric([task_id], float(requests[name]))
            yield family
        yield from self._gauges(task_id, status)

    def _gauges(self, task_id: str, status: TaskStatus) -> Iterator[Metric]:
        yield _gauge(
            "entries",
            "entries per stage and state (read from the shards, cached)",
            ["task", "stage", "state"],
            (
                ([task_id, stage, state], n)
                for stage, counts in status.stages.items()
                for state, n in counts.items()
            ),
        )
        noted: dict[tuple[str, str], int] = {}
        for kind in NOTES:
            noted.update(((stage, kind), 0) for stage in status.stages)
            for note in getattr(status, kind):
                noted[note.stage, kind] = noted.get((note.stage, kind), 0) + 1
        yield _gauge(
            "attention_entries",
            "entries a status report names, per stage and kind (late: past the stage's "
            "deadline; overdue: an expired lease)",
            ["task", "stage", "kind"],
            (([task_id, stage, kind], n) for (stage, kind), n in noted.items()),
        )
        yield _gauge(
            "lost_races_per_commit",
            "races lost per landed commit lately, per stage, by any agent (from the journal "
            "records its shards carry); a stage above 0.3 needs more partitions",
            ["task", "stage"],
            (([task_id, stage], rate) for stage, rate in status.contention.items()),
        )


def _gauge(
    name: str, doc: str, labels: list[str], samples: Iterable[tuple[list[str], float]]
) -> GaugeMetricFamily:
    """A gauge family of ``samples`` (label values, value)."""
    family = GaugeMetricFamily(f"{PREFIX}{name}", doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


class Combined(Collector):
    """The metrics of several tasks (those ``sources()`` gives when scraped) as one
    collector: each family once, carrying every task's samples (an exposition that names a
    family twice is invalid)."""

    def __init__(self, sources: Callable[[], Iterable[TaskMetrics]]) -> None:
        self.sources = sources

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: registering must not read the store

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for metrics in self.sources():
            for family in metrics.collect():
                found = families.get(family.name)
                if found is None:
                    families[family.name] = family
                else:
                    found.samples.extend(family.samples)
        yield from families.values()


def _histogram(task_id: str, latency: dict[str, tuple[list[int], float]]) -> Metric:
    family = HistogramMetricFamily(
        f"{PREFIX}commit_seconds",
        "seconds from a commit's call to its landed write (waiting for a write in flight and "
        "lost races included), by command",
        labels=["task", "command"],
    )
    for command, (counts, total) in sorted(latency.items()):
        bounds = [*map(floatToGoString, COMMIT_BUCKETS), "+Inf"]
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        family.add_metric(
            [task_id, command], list(zip(bounds, map(float, cumulative), strict=True)), total
        )
    return family


def register(
    task: Task,
    registry: CollectorRegistry | None = None,
    *,
    cache_seconds: float = 15.0,
) -> TaskMetrics:
    """Count ``task``'s commits and expose its metrics in ``registry`` (a new
    ``CollectorRegistry`` when None; pass ``prometheus_client.REGISTRY`` to add them to the
    default one an exporter already serves). ``metrics.registry`` is where they went;
    ``metrics.stop()`` unsubscribes and unregisters them."""
    metrics = TaskMetrics(task, cache_seconds)
    target = registry if registry is not None else CollectorRegistry()
    target.register(metrics)
    metrics.registry = target
    metrics._unsubscribe = task.subscribe(metrics.observe)
    return metrics


def asgi_app(registry: CollectorRegistry) -> Any:
    """An ASGI app that serves ``registry`` in the Prometheus text format (mount it at
    ``/metrics``)."""
    return make_asgi_app(registry)


__all__ = ["COMMIT_BUCKETS", "PREFIX", "Combined", "TaskMetrics", "asgi_app", "register"]
