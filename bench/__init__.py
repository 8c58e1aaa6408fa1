"""objmanifest's benchmark suite: ``python -m bench`` (see ``bench/run.py`` and BENCHMARKS.md).

Every benchmark measures its peer or limit in the same run and reports the ratio; results go
to ``bench/results/*.json`` and ``python -m bench.report`` renders them into BENCHMARKS.md.
"""
