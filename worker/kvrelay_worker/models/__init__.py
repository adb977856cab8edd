"""The decoder: layers, paged attention, rotary tables and the Llama-family model class.

It knows nothing of files or blocks: ``kvrelay_worker.loading`` turns a model name or
path into the config and weights ``factory.build_model`` builds it from, and attention
reads the batch's metadata that the engine's model runner fills in.
"""
