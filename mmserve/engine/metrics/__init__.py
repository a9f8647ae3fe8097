"""Engine metrics: every metric named once, its Prometheus export and vLLM's metric families."""
