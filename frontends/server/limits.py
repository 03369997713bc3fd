"""The server's bounds on a request's numbers, checked by the request bodies (schemas.py) before any work, and the
default of a chat request's max_tokens. Plain constants: the command line reads them without importing the web stack."""

DEFAULT_MAX_TOKENS = 512  # a chat request without max_tokens generates at most this many (and what its context holds)
MAX_LOGPROBS = 20  # top-k alternatives per token, at most
MAX_N = 16  # choices per prompt, at most
MAX_PER_CALL = 4096  # prompts, items, pairs, messages or label ids in one call (frontends/client.py sends 256)
MAX_STOP = 16  # stop strings
MAX_SEED = 2**53 - 1  # the integers every JSON implementation holds exactly (RFC 7493); inside torch's 64 bits
MAX_TOKENS = 2**31 - 1  # a bound on the number itself; the model's context is the real limit (checked later)
