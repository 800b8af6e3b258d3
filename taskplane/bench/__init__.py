"""``taskplane bench`` and the live benches users run (``python -m taskplane.bench.gateway_load``,
``python -m taskplane.bench.agent_sessions``); the project's own harnesses live in ``benchmarks/``."""
