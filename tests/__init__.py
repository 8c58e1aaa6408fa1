"""The test suite: behaviour and conformance suites run against every backend, the CLI,
web, MCP and asyncio faces, the simulation and chaos harness, and the unit tests of the
pure core. Support code lives in ``tests.support``, worker programs in ``tests.workers``."""
