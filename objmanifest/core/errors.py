"""Errors of the pure core: a move the lifecycle table does not allow is a bug in a change,
never a user's error, so it stays outside the public tree."""

from __future__ import annotations


class InvalidTransition(Exception):
    """A move the lifecycle table does not allow: a bug in a change, never a user's error."""

    def __init__(self, state: object, event: object) -> None:
        super().__init__(f"no transition from {str(state)!r} on {str(event)!r}")
        self.state = state
        self.event = event
