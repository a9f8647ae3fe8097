"""Per-request outputs: incremental detokenizing, stop strings, finish reasons, n > 1 fan-out
and the per-item media usage."""
