"""One module per model family: its preset specs, its config as the hub publishes it, and its
processor files."""
