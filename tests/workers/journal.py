"""An agent in its own process that commits as fast as it can, for the journal's kill test
(``tests/test_journal_kill.py``).

``python tests/workers/journal.py --endpoint URL --bucket B --prefix P --name NAME --count N``
(the ``AWS_*`` variables of the server in the environment): declares, claims and produces
``N`` entries ``NAME-0`` ... of stage ``s`` of task ``job``, printing each id when it is
ready, then waits for its journal blocks and prints ``done``.
"""

from __future__ import annotations

import argparse

import objmanifest as om


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--endpoint", "--bucket", "--prefix", "--name"):
        parser.add_argument(name, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    store = om.connect(f"s3://{args.bucket}/{args.prefix}", endpoint_url=args.endpoint)
    task = om.Task.open(store, "job")
    agent = task.agent(args.name)
    for i in range(args.count):
        file_id = f"{args.name}-{i}"
        task.declare(file_id, "s")
        claim = agent.claim(file_id)
        assert claim is not None
        agent.put(claim, file_id.encode())
        print(file_id, flush=True)
    task.flush_journal()
    print("done", flush=True)


if __name__ == "__main__":
    main()
