"""What the workloads share: the fair-comparison harness (rounds, contention meter, priority),
the engines under test, deterministic images and request streams, the transformers reference,
the servers to launch, the vLLM baseline, and results with their tables."""
