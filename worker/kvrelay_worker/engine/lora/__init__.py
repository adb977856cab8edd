"""LoRA adapters in the engine: loaded folders in host memory, a few device slots for the
ones running requests use (``lora_manager``), and each request's adapter (``adapter``)."""
