"""A job's life in Redis as the worker writes it: claim, lease, events and their log,
release, hand-back, and taking over the jobs of dead workers."""
