"""``bench all``: every benchmark of benchmarks/README.md in one run, and its tables."""
