"""The status page in a real browser: Debian's headless Chromium, driven by Playwright with
the system browser (``scripts/test.sh`` installs the ``chromium`` package; no browser is
downloaded). The board is loaded while agents run a pipeline in a thread against a moto
server; its counts change without a reload; once idle, every poll is conditional (it sends
the last ETag) and gets a 304; an entry's page is reached by clicking, shows
its history and lineage graph, and a hostile file id is shown as text, never run.

Screenshots go to the test's tmp directory; set ``OBJMANIFEST_WEB_SCREENSHOTS=DIR`` to keep
them (``docs/board.png`` comes from there)."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

import objmanifest as om
from objmanifest.web import pages, server
from objmanifest.web.views import Site
from tests.support.stores import running

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(120)]

CHROMIUM = Path(os.environ.get("OBJMANIFEST_TEST_CHROMIUM", "/usr/bin/chromium"))
WAIT_MS = 30_000
REPORT = "report/<script>alert(1)</script>.pdf"


def total(page: Page, state: str) -> int:
    """The board's total of ``state``, as the page shows it now."""
    return int(page.inner_text(f"[data-total={state}] b"))


def until(page: Page, what: str, check: Callable[[], bool]) -> None:
    """Wait for the page to show ``what`` (checked from here: the page's Content Security
    Policy forbids the string evaluation ``wait_for_function`` uses)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not check():
        assert time.monotonic() < deadline, f"the page did not show {what}"
        page.wait_for_timeout(100)


def pipeline(task: om.Task, started: threading.Event) -> None:
    """Collectors produce 22 of 24 raw files (one dies, one is still being written);
    writers consume six each and produce a draft; the fourth draft is blocked."""
    collector, writer = task.agent("collector-1"), task.agent("writer-1")
    started.wait(30)
    for i in range(22):
        claim = collector.claim(f"raw/{i:02d}.json")
        assert claim is not None
        collector.put(claim, f'{{"row": {i}}}'.encode())
        time.sleep(0.1)
    for _ in range(2):
        claim = collector.claim("raw/22.json")
        assert claim is not None
        collector.fail(claim, "upstream answered HTTP 503")
    assert collector.claim("raw/23.json") is not None  # held: writing
    for j in range(3):
        for i in range(6 * j, 6 * j + 6):
            writer.consume(f"raw/{i:02d}.json")
        claim = writer.claim(f"draft/part-{j}.md")
        assert claim is not None
        writer.put(claim, f"# part {j}\n".encode())


@pytest.fixture
def pipeline_task() -> Iterator[om.Task]:
    store = running("moto").connect(f"t-{uuid.uuid4().hex[:12]}")
    task = om.Task.create(
        store,
        "report-0001",
        stages=["collect", "write", "check"],
        lease_seconds=600,
        max_retries=1,
        partitions={"collect": 2},
    )
    task.declare_many([{"file_id": f"raw/{i:02d}.json", "stage": "collect"} for i in range(24)])
    task.declare_many(
        [
            {
                "file_id": f"draft/part-{j}.md",
                "stage": "write",
                "depends_on": [f"raw/{i:02d}.json" for i in range(6 * j, 6 * j + 6)],
            }
            for j in range(4)
        ]
    )
    task.declare(
        REPORT,
        stage="check",
        depends_on=[f"draft/part-{j}.md" for j in range(4)],
        consumers=["reviewer"],
    )
    yield task


def test_the_board_updates_live_and_leads_to_an_entrys_history_and_lineage(
    pipeline_task: om.Task, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser test needs Chromium at {CHROMIUM}: run scripts/test.sh as root "
            "(it installs Debian's chromium package), or apt-get install chromium"
        )
    task = pipeline_task
    site = Site(task.store, task.task_id, interval=0.3)
    sock = server.listen("127.0.0.1", 0)
    url = server.url_of(sock)
    web = server.make_server(site, sock, token=None)
    serving = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    started = threading.Event()
    agents = threading.Thread(target=pipeline, args=(task, started), daemon=True)
    agents.start()
    dialogs: list[str] = []
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            polls: list[tuple[str | None, int, str | None]] = []
            """The board's API calls: the If-None-Match sent, the status, the ETag answered."""
            board_api = url + "api/tasks/report-0001"
            page.on(
                "response",
                lambda r: (
                    polls.append(
                        (r.request.headers.get("if-none-match"), r.status, r.headers.get("etag"))
                    )
                    if r.url == board_api
                    else None
                ),
            )
            page.set_default_timeout(WAIT_MS)

            # The board, before the agents start.
            page.goto(url)
            page.wait_for_selector("[data-total=pending] b")
            assert page.inner_text("[data-total=ready] b") == "0"
            assert page.inner_text("[data-total=pending] b") == "29"
            page.evaluate("window.__loaded_once = true")

            # While they work, the counts move without a reload.
            started.set()
            until(page, "5 ready", lambda: total(page, "ready") >= 5)
            moving = total(page, "ready")
            until(page, f"more than {moving} ready", lambda: total(page, "ready") > moving)
            assert page.evaluate("window.__loaded_once") is True
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

            # Once they are done, the board says exactly what the store holds.
            agents.join(60)
            assert not agents.is_alive()
            status = task.status()
            want = status.totals
            until(
                page,
                "the final counts",
                lambda: (
                    (total(page, "consumed"), total(page, "ready"))
                    == (want["consumed"], want["ready"])
                ),
            )
            for state, n in want.items():
                assert page.inner_text(f"[data-total={state}] b") == str(n), state
            for stage, counts in status.stages.items():
                for state, n in counts.items():
                    cell = f'td[data-stage="{stage}"][data-state="{state}"]'
                    assert page.inner_text(cell) == str(n), (stage, state)
            assert page.inner_text("section[data-kind=dead] a") == "raw/22.json"
            blocked = page.inner_text("section[data-kind=blocked]")
            assert "draft/part-3.md" in blocked and REPORT in blocked
            assert page.evaluate("window.__loaded_once") is True
            # Idle now: every poll is conditional, and an unchanged board is a 304.
            idle = len(polls)
            until(
                page, "three 304s in a row", lambda: [p[1] for p in polls[idle:]][-3:] == [304] * 3
            )
            etag = None  # each poll sends the ETag of the last board it was given
            for sent, status, answered in polls:
                assert sent == etag and status in (200, 304), (sent, etag, status)
                if status == 200:
                    assert answered is not None
                    etag = answered
            assert polls[0][1] == 200 and len(polls) > 3
            page.wait_for_timeout(400)  # a refresh or two more, then the picture
            page.screenshot(path=str(tmp_path / "board.png"), full_page=True)

            # A stage's entries, filtered, then an entry's page, all by clicking.
            page.click("a[href='/tasks/report-0001/stages/collect?state=dead']")
            page.wait_for_selector("table.entries tbody tr")
            assert page.inner_text("table.entries tbody").count("raw/") == 1
            assert "upstream answered HTTP 503" in page.inner_text("table.entries tbody")
            page.screenshot(path=str(tmp_path / "entries.png"), full_page=True)
            page.goto(url + "tasks/report-0001/stages/check")
            page.click(f"a[href='{pages.entry_url(task.task_id, REPORT)}']")
            page.wait_for_selector("svg.lineage")
            assert page.inner_text("h1") == REPORT  # shown as text, not run
            assert page.locator("ol.timeline li").count() == len(task.history(REPORT))
            nodes = page.locator("svg.lineage a.node")
            assert nodes.count() == len(task.lineage(REPORT).nodes) == 1 + 4 + 24
            page.screenshot(path=str(tmp_path / "entry.png"), full_page=True)
            # Each node is a link to its entry's page.
            page.click(f"svg.lineage a[href='{pages.entry_url(task.task_id, 'draft/part-0.md')}']")
            until(page, "the draft's page", lambda: page.inner_text("h1") == "draft/part-0.md")
            page.wait_for_selector("ol.timeline li")
            steps = [t.to_state for t in task.history("draft/part-0.md")]
            assert steps == ["pending", "writing", "ready"]
            assert page.locator("ol.timeline li").count() == 3
            browser.close()
    finally:
        started.set()
        web.should_exit = True
        serving.join(30)
        sock.close()
    assert dialogs == [] and errors == []
    keep = os.environ.get("OBJMANIFEST_WEB_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for name in ("board.png", "entries.png", "entry.png"):
            shutil.copy(tmp_path / name, Path(keep) / name)
