"""HTTP hygiene every route shares: OpenAI-shaped errors, request limits, body reading and the
JSON guard, the access policy and its middlewares, SSE streaming helpers."""
