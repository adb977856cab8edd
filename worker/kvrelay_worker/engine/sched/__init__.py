"""Scheduling: which sequences run in the next step, with how many tokens, and who is
preempted when the KV pool runs short (continuous batching with chunked prefill)."""
