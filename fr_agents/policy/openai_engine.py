"""OpenAIEngine: token-in/token-out generation against any OpenAI-compatible completions server.

It is meant for *evaluating* served models (vLLM, SGLang, llama.cpp server, ...), so it cannot
receive weights: :meth:`set_weights` raises. Requests go to ``POST {base_url}/completions`` with the
prompt as a list of token ids (the OpenAI completions API accepts token arrays) and ask for the
sampled token's log-prob (``logprobs=0``: only the chosen token) with token ids returned as
``"token_id:<id>"`` strings (``return_tokens_as_token_ids``, a vLLM extension that other servers
also implement). ``stop_token_ids`` is sent as the vLLM extension field of the same name.

Log-probs are what the server reports. vLLM reports the *raw model* log-probs by default; start it
with ``--logprobs-mode processed_logprobs`` so they describe the tempered distribution sampled from.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from fr_agents.policy.base import Engine, Generation, SamplingOptions


class OpenAIEngineError(RuntimeError):
    """The server answered with an error or with a response lacking token ids / log-probs."""


class OpenAIEngine(Engine):
    """Completions client. ``base_url`` ends with ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        version: int = 0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.version = version

    def request_body(self, prompt_ids: Sequence[int], options: SamplingOptions) -> dict[str, Any]:
        """The JSON body sent for one generation."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if options.top_k:
            body["top_k"] = options.top_k
        if options.stop_token_ids:
            body["stop_token_ids"] = list(options.stop_token_ids)
        if options.stop_strings:
            body["stop"] = list(options.stop_strings)
            body["include_stop_str_in_output"] = True
        if options.seed is not None:
            body["seed"] = options.seed
        return body

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            self.base_url + "/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise OpenAIEngineError(f"{self.base_url}: HTTP {e.code}: {e.read()[:500]!r}") from e

    @staticmethod
    def parse(reply: dict[str, Any], version: int) -> Generation:
        """Turn one completions reply into a :class:`Generation`."""
        try:
            choice = reply["choices"][0]
            lp = choice["logprobs"]
            tokens, logprobs = lp["tokens"], lp["token_logprobs"]
        except (KeyError, IndexError, TypeError) as e:
            raise OpenAIEngineError(
                f"reply lacks choices[0].logprobs.tokens/token_logprobs: {reply!r:.300}"
            ) from e
        ids = []
        for t in tokens:
            if not (isinstance(t, str) and t.startswith("token_id:")):
                raise OpenAIEngineError(
                    f"token {t!r} is not 'token_id:<id>': the server must support return_tokens_as_token_ids"
                )
            ids.append(int(t.removeprefix("token_id:")))
        if any(x is None for x in logprobs):
            raise OpenAIEngineError("the server returned a null log-prob for a sampled token")
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Generation(ids, [float(x) for x in logprobs], version, reason)

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if options.entropies:
            raise NotImplementedError(
                "OpenAIEngine: per-token entropies (SamplingOptions.entropies, asked for by "
                "rollout.branch_policy=token) need the hf engine"
            )
        version = self.version
        reply = await asyncio.to_thread(self._post, self.request_body(prompt_ids, options))
        return self.parse(reply, version)

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise NotImplementedError(
            "OpenAIEngine talks to an external server and cannot load weights; "
            "use HFEngine or VLLMEngine to train"
        )
