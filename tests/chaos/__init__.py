"""A seeded fault-injection harness: real Redis, real workers, a random schedule of
faults from one seed, and a checker of what every stream and the store must show.

``runner.run_schedule(seed)`` is the one door; ``docs/chaos.md`` describes the rules.
"""
