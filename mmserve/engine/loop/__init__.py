"""The step loop: ``LLMEngine`` (assembly, step), step isolation, the stall policy and the
warm-up."""
