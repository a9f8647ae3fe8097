"""``bench store``: the encoder store's lookup cost, and re-encodes after a restart or on
another replica."""
