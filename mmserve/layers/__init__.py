"""Torch building blocks shared by models and the worker: paged attention, rotary, norms."""
