"""Reproducible benchmark workloads (``mmserve bench <workload>``)."""
