"""OpenAI-compatible HTTP server: ``app`` (FastAPI routes), ``server`` (uvicorn launch,
in-thread server), ``cli_args`` (``mmserve serve`` flags), ``serve_policies`` (the HTTP and
media policies of those flags), ``vllm_flags`` (vLLM's flags mmserve refuses or ignores);
``http/`` (errors, limits, bodies, policy, streaming), ``completions/`` (chat and completions),
``routes/`` (tokenize, playground page). Nothing heavy is imported here so that the CLI parser
stays fast.
"""
