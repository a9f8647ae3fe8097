"""The vision towers: CLIP and SigLIP (up to a feature layer), and the Qwen2-VL, Qwen2.5-VL and
Qwen3-VL ViTs."""
