"""Setting an engine up: configs from a checkpoint, the device, loading weights, the memory plan
and profile, cache sizing, allocator tuning, the chat template and generation defaults, and
``ModelFront`` (what admission reads of the model)."""
