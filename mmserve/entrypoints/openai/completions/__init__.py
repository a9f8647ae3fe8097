"""/v1/chat/completions and /v1/completions: the protocol models, which vLLM fields are
implemented or refused, the sampling and structured-output fields, tools, logprobs, the handling
and the response bodies."""
