"""Human views of results: tables for status and entries, tab-separated lines for claims.

Claims print as ``FILE_ID<TAB>STAGE<TAB>EPOCH<TAB>LEASE_EXPIRES_AT`` so a shell can ``read``
them straight into variables; everything else is for eyes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

import objmanifest as om
from objmanifest.local.styles import ATTENTION_STYLES, STATE_STYLES

from ..core.report import EntryNote, IndexNote


def text_time(at: datetime | None) -> str:
    """A time as a line of text shows it ("-" for none)."""
    return at.isoformat() if at is not None else "-"


def claim_line(claim: om.Claim) -> str:
    """One claim as a tab-separated line a shell can split."""
    expiry = claim.lease_expires_at.isoformat()
    return f"{claim.file_id}\t{claim.stage}\t{claim.epoch}\t{expiry}"


def state_text(state: om.State | str) -> Text:
    known = om.State(state) if state in {s.value for s in om.State} else None
    value = state.value if isinstance(state, om.State) else str(state)
    return Text(value, style=STATE_STYLES[known] if known is not None else "")


def entry_view(entry: om.Entry) -> RenderableType:
    """Every field of one entry that has a value, one per line."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, str | Text]] = [
        ("file_id", entry.file_id),
        ("stage", entry.stage),
        ("state", state_text(entry.state)),
        ("owner", entry.owner or "-"),
        ("epoch", str(entry.epoch)),
        ("lease_expires_at", text_time(entry.lease_expires_at)),
        ("retry_count", str(entry.retry_count)),
        *(
            (("retry_at", f"{text_time(entry.retry_at)} (backing off until then)"),)
            if entry.retry_at
            else ()
        ),
        *((("claimed_at", text_time(entry.claimed_at)),) if entry.claimed_at else ()),
        *((("ready_at", text_time(entry.ready_at)),) if entry.ready_at else ()),
        ("depends_on", ", ".join(entry.depends_on) or "-"),
        ("consumers", ", ".join(entry.consumers) or "(queue: first consumer takes it)"),
        ("consumed_by", ", ".join(entry.consumed_by) or "-"),
        ("size", "-" if entry.size is None else f"{entry.size} bytes"),
        ("checksum", entry.checksum or "-"),
        ("key", entry.key or "-"),
        ("error", Text(entry.error, style="red") if entry.error else "-"),
        ("declared_at", text_time(entry.declared_at)),
        ("updated_at", text_time(entry.updated_at)),
    ]
    shown = {name for name, _ in rows}
    for name, value in entry.model_dump().items():  # chunking fields, newer versions' fields
        if name not in shown and value is not None:
            rows.append((name, text_time(value) if isinstance(value, datetime) else str(value)))
    for name, value in rows:
        grid.add_row(name, value if isinstance(value, Text) else Text(value))
    return grid


def _count(n: int, state: str) -> Text:
    return Text(str(n), style=STATE_STYLES[om.State(state)] if n else "dim")


def counts_table(status: om.TaskStatus) -> Table:
    """Entries per stage and state, with a total row."""
    table = Table(box=box.SIMPLE_HEAD, show_footer=len(status.stages) > 1)
    totals = status.totals
    table.add_column("stage", footer="all stages")
    for state in om.State:
        table.add_column(
            state.value, justify="right", footer=_count(totals[state.value], state.value)
        )
    table.add_column("total", justify="right", footer=str(sum(totals.values())))
    for stage, counts in status.stages.items():
        cells = [_count(counts.get(s.value, 0), s.value) for s in om.State]
        table.add_row(Text(stage), *cells, str(sum(counts.values())))
    return table


def attention_table(status: om.TaskStatus) -> Table | None:
    """Dead, overdue and blocked entries, worst first, then file ids the index and the
    shards disagree about; None when nothing needs attention."""
    notes: Iterable[tuple[str, EntryNote | IndexNote]] = [
        *(("dead", n) for n in status.dead),
        *(("overdue", n) for n in status.overdue),
        *(("blocked", n) for n in status.blocked),
        *(("late", n) for n in status.late),
        *(("backing off", n) for n in status.backing_off),
        *(("damaged", n) for n in status.unindexed),
        *(("unfinished", n) for n in status.unfinished),
    ]
    table = Table(box=box.SIMPLE_HEAD, title="needs attention", title_justify="left")
    for name in ("", "file id", "stage", "state", "why"):
        table.add_column(name)
    for kind, note in notes:
        style = ATTENTION_STYLES[kind]
        table.add_row(
            Text(kind, style=style),
            Text(note.file_id, style=style),
            Text(note.stage),
            state_text(note.state) if isinstance(note, EntryNote) else Text("-"),
            Text(note.reason),
        )
    return table if table.row_count else None


def status_view(status: om.TaskStatus) -> RenderableType:
    """The task at a glance: a headline, counts per stage, then what needs attention."""
    total = sum(status.totals.values())
    progress = "finished" if status.finished and total else "in progress"
    headline = Text.assemble(
        ("task ", "dim"),
        (status.task_id, "bold"),
        ("  store time ", "dim"),
        text_time(status.store_time),
        "  ",
        (progress, "green" if progress == "finished" else "yellow"),
    )
    parts: list[RenderableType] = [headline, counts_table(status)]
    attention = attention_table(status)
    if attention is not None:
        parts.append(attention)
    for stage in status.contended:
        parts.append(
            Text.assemble(
                ("contended ", ATTENTION_STYLES["overdue"]),
                (stage, "bold"),
                f": its writers lost {status.contention[stage]:.2f} races per commit lately, "
                "more agents than its shards take: split it into more partitions "
                "(--partitions STAGE=auto --agents N, in a new task)",
            )
        )
    if status.damaged:
        table = Table(box=box.SIMPLE_HEAD, title="damaged", title_justify="left")
        for name in ("object", "kind", "problem", "fix"):
            table.add_column(name)
        for note in status.damaged:
            style = ATTENTION_STYLES["damaged"]
            shown = note.address or note.key
            table.add_row(Text(shown, style=style), note.kind, Text(note.problem), note.fix)
        parts.append(table)
    return Group(*parts)


def entries_table(entries: Iterable[om.Entry], title: str) -> Table:
    """A compact list of entries (reap's released entries)."""
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for name in ("file id", "stage", "state", "retries", "error"):
        table.add_column(name)
    for e in entries:
        table.add_row(
            Text(e.file_id),
            Text(e.stage),
            state_text(e.state),
            str(e.retry_count),
            Text(e.error or ""),
        )
    return table


# -- history -----------------------------------------------------------------------------


def _change_text(item: str, before: str | None, after: str, epoch: int | None) -> str:
    moved = f"{before} -> {after}" if before is not None else after
    return f"{item}: {moved}" + (f" (epoch {epoch})" if epoch else "")


def record_line(record: om.JournalRecord) -> str:
    """``TIME  OBJECT vVERSION  COMMAND  ACTOR  item: before -> after (epoch N); ...``"""
    changes = "; ".join(
        _change_text(c.item, c.before, c.after, c.epoch) for c in record.transitions
    )
    actor = record.actor or "-"
    return (
        f"{text_time(record.at)}  {record.object_key} v{record.version}  {record.command}  {actor}"
        + (f"  {changes}" if changes else "")
    )


def transition_line(step: om.Transition) -> str:
    """``TIME  vVERSION  COMMAND  ACTOR  before -> after  epoch N  retries N  error``"""
    moved = f"{step.from_state} -> {step.to_state}" if step.from_state else step.to_state
    parts = [text_time(step.at), f"v{step.version}", step.command, step.actor or "-", moved]
    if step.epoch:
        parts.append(f"epoch {step.epoch}")
    if step.retry_count:
        parts.append(f"retries {step.retry_count}")
    if step.error:
        parts.append(f"error: {step.error}")
    return "  ".join(parts)


def _none_because(journaled: bool, filters: list[str], dropped: bool) -> str:
    """Why there is nothing to show: the task keeps no journal, the filters match nothing,
    or what there was is gone (said above)."""
    if not journaled:
        return (
            ": this task was made before objmanifest 0.2.0 and keeps none until "
            "`objmanifest migrate`"
        )
    if filters:
        return f" match {' and '.join(filters)}"
    if dropped:
        return " left (the lines above say what was dropped or lost)"
    return ""


def log_view(
    records: list[om.JournalRecord],
    *,
    journaled: bool = True,
    filters: list[str] | None = None,
    dropped: bool = False,
) -> list[str]:
    """One line per record (plain text, so it greps and never wraps); when there is none,
    why (``filters``: the options that chose, such as ``--by nobody``)."""
    if not records:
        return [f"no journal records{_none_because(journaled, filters or [], dropped)}"]
    return [record_line(r) for r in records]


def history_view(
    file_id: str,
    steps: list[om.Transition],
    *,
    journaled: bool = True,
    filters: list[str] | None = None,
    dropped: bool = False,
) -> list[str]:
    """One line per transition of ``file_id``, oldest first (or why there is none)."""
    if not steps:
        why = _none_because(journaled, filters or [], dropped)
        return [f"no journal records for {file_id}{why}"]
    return [transition_line(t) for t in steps]


def lineage_view(graph: om.Lineage) -> RenderableType:
    """The upstream tree of the root, each node with its producer and checksum (a node
    reached twice is shown once, then referred to)."""
    tree = Tree(_node_text(graph.nodes[graph.root]))
    shown = {graph.root}

    def grow(branch: Tree, file_id: str) -> None:
        for dep in graph.nodes[file_id].depends_on:
            if dep in shown:
                branch.add(Text(f"{dep} (above)", style="dim"))
                continue
            shown.add(dep)
            grow(branch.add(_node_text(graph.nodes[dep])), dep)

    grow(tree, graph.root)
    return tree


def _node_text(node: om.LineageNode) -> Text:
    text = Text(node.file_id, style="bold")
    text.append("  ")
    text.append_text(state_text(node.state) if node.state else Text("undeclared", style="dim"))
    if node.producer:
        text.append(f"  by {node.producer} (epoch {node.epoch})")
    if node.checksum:
        text.append(f"  {node.checksum}  {node.size} bytes", style="dim")
    return text
