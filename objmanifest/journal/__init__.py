"""The journal: reading history (log, lineage), retention and trimming, and replay of a
shard from its journal when the shard itself is lost.

Blocks are written by the commit loop (``cas.loop.BlockWriter``); this package reads, trims
and replays them. It never changes an entry.
"""
