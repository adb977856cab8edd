"""How a task enters the worker: the message's size, its payload checked and turned into
engine input, and the checks a job passes when first picked up."""
