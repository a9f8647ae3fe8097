"""OpenAI-compatible HTTP server: protocol models, serving, errors, app, ``serve`` CLI flags.

Modules: ``protocol`` (pydantic request/response models), ``errors`` (OpenAI-shaped error
bodies and status mapping), ``streaming`` (SSE / delta / disconnect helpers), ``serving``
(chat and completion handling), ``app`` (FastAPI routes, auth, metrics middleware),
``cli_args`` (``mmserve serve`` flags), ``server`` (uvicorn launch, in-thread server).
Nothing heavy is imported here so that the CLI parser stays fast.
"""
