"""What the workloads share: the fair-comparison harness (rounds, contention, priority),
the engines under test (``engines/``: runners, transformers reference, vLLM baseline, meter),
deterministic images and request streams, the servers to launch, and results with their
tables."""
