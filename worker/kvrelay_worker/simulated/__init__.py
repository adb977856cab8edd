"""A simulated engine: no weights and no torch, steps that take as long as a GPU's would.

It lets one machine run dozens of worker processes through the real worker path
(EngineService, publisher, leases, heartbeats, Redis), so the load workers put on Redis
can be measured at a scale no test machine has GPUs for (benchmarks/scaling.py).
Selected with ``KVRELAY_MODEL=simulated`` (or ``simulated:<name>``).
"""
