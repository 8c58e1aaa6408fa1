"""The pure core: models, the key layout, the lifecycle table, leases and backoff, the named
changes of entries, operator verbs and the index, checksums, commit events and the runtime.

Nothing here reads or writes a store. All nondeterminism (threads, clock, sleeps,
randomness, ids) comes from ``runtime.Runtime``, the one module here that touches them, so
the rest can be tested and mutated without a server. It never imports a package above it.
"""
