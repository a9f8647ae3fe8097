"""Checkpoints: hub model IDs downloaded into the hub's cache, ``.safetensors`` files read
without copies, and the weight loader (HF name mapping, materializing a meta-device model)."""
