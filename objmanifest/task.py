"""A task: the manifest of one job, and the agents that work on it.

``Task`` is the public face of ``manifest.Manifest`` (creating, opening, declaring, status,
reaping) that can also make its agents: ``task.agent(name, role)``.
"""

from __future__ import annotations

from .agent import Agent
from .manifest import Manifest, attention


class Task(Manifest):
    """The manifest of one job. Safe to share between threads."""

    def agent(self, name: str, role: str | None = None) -> Agent:
        """An agent working on this task; ``role`` (for consumers) defaults to the name."""
        return Agent(self, name, role)


__all__ = ["Task", "attention"]
