"""Hypothesis profiles for the unit tests: ``--hypothesis-profile=mutation`` makes every run
draw the same examples, so a mutation run's verdicts do not depend on luck."""

from hypothesis import settings

settings.register_profile("mutation", derandomize=True, database=None, deadline=None)
