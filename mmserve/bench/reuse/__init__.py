"""``bench reuse``: R requests repeating a fraction of earlier images and prefixes (or Zipf
draws), on each engine."""
