"""The paged KV cache: the block pool and prefix cache, how many blocks fit, and the host
copies that swap preemption moves blocks through."""
