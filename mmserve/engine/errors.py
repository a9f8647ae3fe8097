"""Engine failures that are not one request's fault."""

from __future__ import annotations

import torch

_FATAL_MARKERS = ("CUDA error", "CUBLAS_STATUS", "cuDNN error", "device-side assert", "NCCL error")


class EngineDeadError(RuntimeError):
    """A fatal error (e.g. a CUDA error) poisoned the process: every request failed and the
    engine refuses new work (the server's /health answers 503)."""


def is_fatal_error(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the device in an unknown state, so no retry can be trusted."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    if isinstance(exc, torch.OutOfMemoryError):
        return False  # a batch too big: retrying smaller parts is the remedy
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _FATAL_MARKERS)


class EngineError(RuntimeError):
    """Base class of the async engine's own failures."""


class EngineOverloadedError(EngineError):
    """More requests are queued than ``max_queued_requests`` allows (HTTP 503)."""


class EngineShutdownError(EngineError):
    """The engine is shutting down or its loop is not running (HTTP 503)."""


class EngineStepError(EngineError):
    """The engine failed while running this request (HTTP 500)."""
