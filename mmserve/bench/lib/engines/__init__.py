"""The engines under test and what each run costs: mmserve and transformers runners, the
transformers reference, the vLLM baseline (``vllm_baseline.py`` launches ``vllm_worker.py`` /
``vllm_real.py`` in vLLM's virtualenv) and the stdlib-only ``meter.py`` every engine's runs are
metered with. ``vllm_worker.py`` and ``vllm_real.py`` run as scripts that never import mmserve:
they import ``vllm_worker`` / ``meter`` as plain modules from this folder, so those stay here."""
