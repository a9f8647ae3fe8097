"""The async front: the engine loop on its own thread (``AsyncLLMEngine``), its command inbox,
per-request output streams and the bookkeeping of every generate."""
