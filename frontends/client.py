"""A client with the engine's `score` / `generate` interface over HTTP, for a server started by
`python -m engine serve`: `Client("http://127.0.0.1:8000").score([(context, continuation), ...])`.

It carries the server's tokenizer and model config (from /v1/tokenizer), so callers that count tokens or apply
the chat template (the icqs judges) work unchanged. A job is sent in chunks over a few connections at once; the
server puts every chunk into its one engine loop, which shares prefixes across chunks and clients."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import tokenizers

from engine.config import ModelConfig
from engine.errors import UserError
from engine.progress import progress_bar
from engine.stats import EngineStats
from engine.tokenizer import Tokenizer
from engine.validation import Limits

RETRIES_WHEN_BUSY = 60  # a 503 (queue full) is retried after its Retry-After, this many times at most


class Client:
    def __init__(
        self, url: str, api_key: str | None = None, timeout: float = 3600.0, chunk: int = 256, connections: int = 4
    ):
        self.url = url.rstrip("/")
        self.chunk, self.connections = chunk, connections
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=connections)
        )
        info = self._call("GET", "/v1/tokenizer")
        self.model_name = info["model"]
        self.tokenizer = Tokenizer(
            tokenizers.Tokenizer.from_str(info["tokenizer_json"]),
            bos_id=info["bos_id"],
            eos_ids=info["eos_ids"],
            add_bos=info["add_bos"],
            chat_template=info["chat_template"],
        )
        self.config = ModelConfig.from_dict(info["config"], f"{self.url}/v1/tokenizer")
        # the served engine's limits (a server without kv_tokens in /v1/tokenizer: its max_len stands for it)
        self.limits = Limits(self.config.vocab_size, self.config.max_position, info.get("kv_tokens", info["max_len"]))
        self.last_stats = EngineStats()

    @property
    def max_request_tokens(self) -> int:
        return self.limits.max_request_tokens

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        for _ in range(RETRIES_WHEN_BUSY):
            try:
                r = self.http.request(method, path, json=body)
            except httpx.HTTPError as e:
                raise UserError(f"server {self.url}: {e or type(e).__name__}") from None
            if r.status_code == 503:
                time.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            if r.status_code != 200:
                try:
                    message = r.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = r.text[:200]
                raise UserError(f"server {self.url}{path}: {r.status_code}: {message}")
            return r.json()
        raise UserError(f"server {self.url}{path}: still busy after {RETRIES_WHEN_BUSY} tries")

    def _chunked(self, items: list, send, desc: str, progress: bool) -> list:
        """send(offset, chunk) -> list of results, for each chunk, a few at once; the results in order."""
        starts = range(0, len(items), self.chunk)
        out = [None] * len(starts)
        with (
            ThreadPoolExecutor(self.connections) as pool,
            progress_bar(total=len(items), desc=desc, disable=not progress) as bar,
        ):
            futures = {pool.submit(send, s, items[s : s + self.chunk]): k for k, s in enumerate(starts)}
            for future, k in futures.items():
                out[k] = future.result()
                bar.update(len(out[k]))
        return [r for part in out for r in part]

    def _engine_stats(self) -> EngineStats:
        """The server engine's counters now (/health's `engine`: EngineStats' wire form)."""
        try:
            return EngineStats.from_dict(self._call("GET", "/health").get("engine"))
        except ValueError as e:
            raise UserError(f"server {self.url}/health: {e}") from None

    def _job_stats(self, before: EngineStats) -> None:
        """last_stats: the server engine's counters over the job (other clients' work in that time included); the
        other fields are the server's now (peak_kv_pages: its peak since it started)."""
        self.last_stats = self._engine_stats().since(before)

    # ---- the engine's interface ----------------------------------------------------------------------------
    def score(self, requests, share_prefix: bool = True, progress: bool = False):
        """log P(continuation | context) for each (context, continuation) request (text or token ids)."""
        from engine.engine import ScoreResult

        if not share_prefix:
            raise UserError("turning prefix sharing off is not available through a server")
        pairs = [[c, x] for c, x in requests]

        def send(offset, part):
            data = self._call("POST", "/v1/score", {"model": self.model_name, "pairs": part})["data"]
            return [ScoreResult(d["logprob"], d["token_logprobs"], d["num_tokens"], d["is_greedy"]) for d in data]

        before = self._engine_stats()
        results = self._chunked(pairs, send, "scoring", progress) if pairs else []
        self._job_stats(before)
        return results

    def generate(
        self,
        prompts,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        progress: bool = False,
    ):
        """As Engine.generate (prompt i samples with seed + i)."""
        from engine.engine import Generation

        def send(offset, part):
            body = {
                "model": self.model_name,
                "prompts": part,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "seed": None if seed is None else seed + offset,
                "stop": list(stop or []),
            }
            return [
                Generation(d["text"], d["token_ids"], d["finish_reason"], d["token_logprobs"])
                for d in self._call("POST", "/v1/generate", body)["data"]
            ]

        before = self._engine_stats()
        results = (
            self._chunked([p if isinstance(p, str) else list(p) for p in prompts], send, "generating", progress)
            if prompts
            else []
        )
        self._job_stats(before)
        return results
