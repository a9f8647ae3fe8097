"""Admission: the ``Admission`` interface (PromptInput -> checked ProcessedPrompt), the engine's
``RequestIntake``, the prompt checks, the grammar compiler, and the server's pipeline that
fetches and prepares media off the event loop."""
