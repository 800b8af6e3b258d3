"""Measurement harnesses and experiments (``python -m benchmarks.NAME``): not shipped in the wheel.

What a user runs stays in ``taskplane bench`` and ``python -m taskplane.bench.gateway_load``;
the code here measures the project itself (the picker's CPU, the simulator's speed, sweeps of
settings) and is run from the root of a checkout.
"""
