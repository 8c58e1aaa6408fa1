"""The Task/Agent API as coroutines, for asyncio programs (agent frameworks).

``AsyncTask`` and ``AsyncAgent`` wrap a ``Task`` and its ``Agent``: every coroutine hands
the sync call to a thread pool and awaits it, so the event loop never blocks on the store,
and everything below (changes, states, leases, layout, the CAS loop, transfers) is the
one core the sync API uses, with its tests and its guarantees. It never reaches past the
public calls of ``Task`` and ``Agent``, and never calls the store on the event loop's thread.

Why a thread pool and not an async S3 client: one store, one CAS loop and one retry and
fault-handling path, and coroutines of one ``AsyncTask`` share group commits as threads
do; the measurements are in the docs (asyncio, benchmarks).

Cancellation. Cancelling a coroutine does not stop the thread doing its work, so:

* every coroutine, when cancelled, waits for its thread to end before the
  ``CancelledError`` goes on: nothing of a cancelled call keeps running behind it, and a
  call that never started is dropped;
* ``put``, ``put_many`` and ``consume`` tell their thread to stop (``stop=`` of the sync
  call): it stops at the next checkpoint, between the data and the commit or between
  parts, with ``Interrupted``, so a put's entry stays writing under its claim (claimable
  by the holder's next put, or by a takeover once the lease expires), never half-ready,
  and a consume marks nothing and leaves ``dest`` as it was. If the commit was already
  sent, the cancellation waits for its outcome and logs it (the coroutine still raises
  ``CancelledError``);
* a claim that landed although its coroutine was cancelled is released (no retry spent),
  since nobody would hold it.

``tests/test_architecture.py`` checks that the coroutines of this package reach the sync API only
through the pool, and that a run makes no store call on the event loop's thread.
"""

from .agent import AsyncAgent
from .task import AsyncTask

__all__ = ["AsyncAgent", "AsyncTask"]
