"""Chaos against real servers: ``python -m tests.chaos --seed 1 --backend seaweedfs``.

See ``tests/chaos/README.md``.
"""
