"""What every command is given: the parsed arguments, the output, and the store and task
they name, opened on first use."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import objmanifest as om

from ..wire.errors import UsageError
from . import progress
from .output import Output

STAGES_ARROW = " -> "

NO_STORE = "no store given: pass --url s3://BUCKET/PREFIX or set OBJMANIFEST_URL"


@dataclass
class Context:
    """One invocation: parsed arguments, where output goes, and the task, opened once."""

    args: argparse.Namespace
    out: Output
    _store: om.ObjectStore | None = field(default=None, repr=False)
    _task: om.Task | None = field(default=None, repr=False)

    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    def store(self) -> om.ObjectStore:
        if self._store is None:
            url = self.opt("url")
            if not url:
                raise UsageError(NO_STORE)
            if str(url).startswith("memory:"):
                raise UsageError(
                    "memory:// stores live inside one process, and every objmanifest command "
                    "is a process of its own: use an s3://, az://, gs:// or file:// URL "
                    "(file:///DIR needs no server; `objmanifest serve` starts a local S3 server)"
                )
            self._store = om.connect(str(url), endpoint_url=self.opt("endpoint_url"))
        return self._store

    def task_id(self) -> str:
        task_id = self.opt("task")
        if not task_id:
            raise UsageError("no task given: pass --task ID or set OBJMANIFEST_TASK")
        return str(task_id)

    def policy(self) -> om.CasPolicy | None:
        attempts = self.opt("cas_attempts")
        return om.CasPolicy(max_attempts=int(attempts)) if attempts else None

    def task(self) -> om.Task:
        if self._task is None:
            self._task = om.Task.open(self.store(), self.task_id(), policy=self.policy())
        return self._task

    def agent(self) -> om.Agent:
        name = self.opt("agent")
        if not name:
            raise UsageError("no agent name given: pass --agent NAME or set OBJMANIFEST_AGENT")
        return self.task().agent(str(name), self.opt("role"))

    def holder_claim(self) -> tuple[om.Agent, om.Claim]:
        """The agent and the claim named by ``FILE_ID --agent --epoch``."""
        agent = self.agent()
        return agent, agent.resume(self.args.file_id, self.args.epoch)

    def waiting(self, what: str) -> Callable[[], None]:
        """A note for a human that the command waits, shown once if it has to."""
        wait = float(self.opt("wait", 0.0))
        return lambda: self.out.note(f"objmanifest: {what} yet; waiting up to {wait:g}s")

    def show_progress(self) -> bool:
        return progress.wanted(self.out.stderr, bool(self.opt("no_progress")))
