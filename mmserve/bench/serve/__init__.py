"""``bench serve``: an async streaming client against OpenAI-compatible servers, optionally
launched per round."""
