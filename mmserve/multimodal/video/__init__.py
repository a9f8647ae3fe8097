"""One video: decode (PyAV), frame sampling, the per-family video processors and frame groups,
the prepared-video memo, and the video side of the input processor."""
