"""``mmserve bench gpu``: the GPU run in one call (``benchmarks/gpu/run.sh``) and its CPU
dry run."""
