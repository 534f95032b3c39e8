"""HFEngine: a transformers model behind the async :class:`Engine` interface, with dynamic batching.

How it works
------------
Every ``generate()`` call (from any number of concurrent episodes) puts a request on a queue and
awaits a future. One background thread owns the model and runs *waves*: it takes every pending
request (a wave starts once a sleep of ``batch_wait_s`` brings no new request, or ``max_wait_s`` after
its first, or when it is full; the thread sleeps and then takes what came instead of waking at each
arrival, so that a burst of episodes stepping their envs at the same moment lands in one batch),
batches the prompts, runs the prefill (the tokens every prompt of the wave starts with, such as the
chat template's opening, once for the wave), then decodes one token per step for all rows with a
shared KV cache. Rows that finish (stop token, stop string, ``max_tokens``) leave the batch between
steps and their futures resolve at once, so a fast episode does not wait for the slowest row.

For Qwen2/Llama models in float32 or bfloat16 a wave runs :mod:`fr_agents.models.compact`
(``_CompactWave``: right-padded prompts, a preallocated cache with a row per place of the batch,
the prefill's last layer only at each row's last token, the fused projections built once per
weight version) and is a *running batch*: requests queued while it decodes join it between two
steps (prefilled into the places finished rows left), so the batch stays full as episodes come and
go instead of draining to its slowest row. A joiner whose prompt starts with the opening a group of
prompts was seen to share (a chat template, a system prompt, example turns) prefills only what
follows it: the opening's keys and values are kept across joins and recomputed after each weight
swap (:mod:`fr_agents.policy.opening`). A request that continues a finished row (a multi-turn
episode's next turn, whose prompt is the whole conversation so far; a fork of a stored branch)
prefills only what follows that row's tokens: finished rows leave their keys and values in
:class:`~fr_agents.policy.opening.Continuations` (``keep_tokens`` bounds them), so a turn costs
what was added since the last one, not the episode's history. Any other model runs transformers'
forward with left padding and its ``DynamicCache`` (``_TransformersWave``), whose rows only leave.
Both give the same logits up to float rounding.

Sampling is exact: logits are cast to float32, divided by the temperature, normalised with
``log_softmax``; the token is drawn from exactly that distribution and its log-prob is recorded.
No top-k/top-p truncation happens when importance correction is on (``SamplingOptions`` refuses it);
with it off, truncation is applied and the recorded log-prob is that of the truncated distribution.

Weight swaps
------------
:meth:`set_weights` may be called from any thread (e.g. the learner's). The new weights are loaded
*between* two decode steps, never during a forward pass, and ``set_weights`` returns once they are
live. Each sampled token records the version of the weights whose forward produced its
distribution (``Generation.versions``); ``Generation.version`` is the oldest of them. After a swap
the rows keep their KV cache computed by the previous weights, so a post-swap token's log-prob is
that of the distribution it was actually sampled from (old-weight cache, new-weight step): this is
the behaviour distribution, which is what the trainer's importance correction needs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fr_agents import hops
from fr_agents.models.compact import (
    CompactCache,
    Past,
    compact_decode,
    compact_extend,
    compact_prefill,
    compact_reason,
    fused_weights,
)
from fr_agents.policy.base import Engine, Generation, SamplingOptions
from fr_agents.policy.opening import Continuations, Opening, shared_start

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    options: SamplingOptions
    tell: Callable[[hops.Outcome], None]  # hands the caller its outcome (a future or the loop's inbox)
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # filled when options.entropies
    told: bool = False

    def resolve(self, ok: bool, value: Any) -> None:
        """Hand the caller its Generation (``ok``) or error, once."""
        if not self.told:
            self.told = True
            self.tell((ok, value))


class HFEngine(Engine):
    """Dynamic-batching generation with a transformers causal LM (CPU or GPU).

    ``model`` is a loaded ``AutoModelForCausalLM``; ``tokenizer`` is only needed for stop strings
    and the pad id. ``max_batch_size`` caps the rows of one wave. ``on_token``, when set, is called
    from the engine thread with every sampled token id as it is drawn (``fr-agents play`` streams a
    model's turn with it); it observes, it never changes what is sampled. ``compact``: waves run
    :mod:`fr_agents.models.compact`'s prefill and decode (right-padded prompts, a preallocated
    cache, the last layer of the prefill only at each row's last token) where
    :func:`~fr_agents.models.compact.compact_reason` allows (``.compact_reason`` None), else
    transformers' forward with its cache; both give the same logits up to float rounding.
    ``keep_tokens`` bounds the tokens of finished rows kept for requests that continue them
    (:class:`~fr_agents.policy.opening.Continuations`; 0 keeps none).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.002,
        max_wait_s: float = 0.05,
        seed: int = 0,
        version: int = 0,
        on_token: Callable[[int], None] | None = None,
        compact: bool = True,
        keep_tokens: int = 32768,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None:
            pad = getattr(model.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_wait_s = max(max_wait_s, batch_wait_s)
        self.version = version
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._swap_lock = threading.Lock()
        self._pending: tuple[dict[str, Any], int, threading.Event] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.stats = {
            "waves": 0,
            "steps": 0,
            "tokens": 0,
            "rows": 0,
            "joined": 0,
            "shared_prefill_tokens": 0,
            "opening_tokens": 0,
            "prefill_tokens": 0,
            "continued_tokens": 0,
        }
        self.on_token = on_token
        # None: waves run fr_agents.models.compact's prefill and decode; else why they do not
        self.compact_reason = compact_reason(model) if compact else "compact is off"
        self._fused: list | None = None  # fused_weights of the live weights, built on first use
        self.opening = Opening()  # compact waves: the prompts' shared opening, kept across joins
        self.continuations = Continuations(keep_tokens)  # compact waves: finished rows, for their next turn

    def fused(self) -> list:
        """The compact forward's fused projections of the live weights (rebuilt after a swap)."""
        if self._fused is None:
            self._fused = fused_weights(self.model)
        return self._fused

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        """Sample a continuation of ``prompt_ids`` (batched with every other pending call)."""
        fut, tell = hops.awaiter()  # the result comes back with the wave's others, in one loop wake-up
        self._enqueue(prompt_ids, options, tell)
        return await fut

    def generate_sync(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        """Blocking form of :meth:`generate`, for scripts and threads without an event loop."""
        return self.submit(prompt_ids, options).result()

    def submit(self, prompt_ids: Sequence[int], options: SamplingOptions) -> concurrent.futures.Future:
        """Queue one request and return a future resolving to its :class:`Generation`."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(prompt_ids, options, hops.teller(fut))
        return fut

    def _enqueue(
        self, prompt_ids: Sequence[int], options: SamplingOptions, tell: Callable[[hops.Outcome], None]
    ) -> None:
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids must not be empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids holds ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if not isinstance(options, SamplingOptions):
            raise TypeError(f"options must be a SamplingOptions, got {type(options).__name__}")
        gen = None
        if options.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(options.seed)
        req = _Request(ids, options, tell, gen)
        self._ensure_thread()
        self._queue.put(req)

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load ``state_dict`` between two decode steps and set :attr:`version`; returns once live."""
        done = threading.Event()
        with self._swap_lock:
            self._pending = (state_dict, int(version), done)
            if not self._busy:
                self._apply_pending_locked()
        done.wait()

    async def close(self) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """Stop the batching thread; pending requests fail with RuntimeError."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # ------------------------------------------------------------------ weights

    def _apply_pending_locked(self) -> None:
        if self._pending is None:
            return
        state_dict, version, done = self._pending
        self._pending = None
        try:
            with torch.no_grad():
                self.model.load_state_dict(state_dict, strict=True)
            self._fused = None
            self.opening.forget()
            self.continuations.forget()
            self.version = version
            log.debug("weights swapped to version %d", version)
        finally:
            done.set()

    def _between_steps(self) -> int:
        """Apply a pending weight swap (if any) and return the version the next step runs with."""
        with self._swap_lock:
            self._apply_pending_locked()
            return self.version

    # ------------------------------------------------------------------ batching loop

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="HFEngine", daemon=True)
                self._thread.start()

    def _collect(self) -> list[_Request] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        end = time.monotonic() + self.max_wait_s
        # A burst is still arriving while a wait of batch_wait_s brings more (within max_wait_s in
        # all). The thread sleeps and then takes what came, rather than waking at each arrival: on
        # one busy core every wake-up is a switch away from the event loop that is queueing them.
        self._take(batch)
        while len(batch) < self.max_batch_size:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.batch_wait_s, left))
            if not self._take(batch):
                break
        return batch

    def _take(self, batch: list[_Request]) -> bool:
        """Move what is queued into ``batch`` (up to ``max_batch_size``); False when the queue held
        nothing, or the close marker (left queued for :meth:`_loop`)."""
        return self._take_up_to(batch, self.max_batch_size - len(batch))

    def _take_up_to(self, batch: list[_Request], room: int) -> bool:
        """Move up to ``room`` queued requests into ``batch``; False as for :meth:`_take`."""
        took = False
        while room > 0:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return took
            if item is None:
                self._queue.put(None)
                return False
            batch.append(item)
            room -= 1
            took = True
        return took

    def _loop(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                break
            with self._swap_lock:
                self._busy = True
            try:
                with torch.inference_mode():
                    self._run_wave(batch)
            except Exception as e:  # noqa: BLE001 - hand the error to every caller of this wave
                log.exception("generation wave failed")
                for r in batch:
                    r.resolve(False, e)
            finally:
                with self._swap_lock:
                    self._busy = False
                    self._apply_pending_locked()
        while True:  # fail whatever is still queued after close
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                break
            if r is not None:
                r.resolve(False, RuntimeError("HFEngine closed"))

    def _run_wave(self, reqs: list[_Request]) -> None:
        self.stats["waves"] += 1
        self.stats["rows"] += len(reqs)
        version = self._between_steps()
        wave = (_CompactWave if self.compact_reason is None else _TransformersWave)(
            self, reqs, self._shared_len(reqs)
        )
        self.stats["shared_prefill_tokens"] += wave.shared
        logits = wave.first_logits()
        active = list(reqs)  # the rows in the batch, in the wave's row order
        joining: list[_Request] = []
        try:
            while True:
                self.stats["steps"] += 1
                tokens = self._sample(active, logits)
                self._record_entropies(active, logits)
                keep: list[int] = []
                for row, r in enumerate(active):
                    tok, lp = tokens[row]
                    r.token_ids.append(tok)
                    r.logprobs.append(lp)
                    r.versions.append(version)
                    self.stats["tokens"] += 1
                    if self.on_token is not None:
                        self.on_token(tok)
                    reason = self._finished(r)
                    if reason is None:
                        keep.append(row)
                    else:
                        wave.keep(row, r, version)
                        r.resolve(
                            True,
                            Generation(
                                token_ids=r.token_ids,
                                logprobs=r.logprobs,
                                version=min(r.versions),
                                finish_reason=reason,
                                versions=r.versions,
                                entropies=r.entropies,
                            ),
                        )
                # a running compact batch takes queued requests into the places finished rows left
                joining = self._join(self.max_batch_size - len(keep)) if wave.joinable else []
                if not keep and not joining:
                    return
                if len(keep) < len(active):
                    order = wave.select(keep)
                    active = [active[row] for row in order]
                version = self._between_steps()
                parts = []
                if active:
                    parts.append(
                        wave.next_logits(torch.tensor([r.token_ids[-1] for r in active], device=self.device))
                    )
                if joining:
                    self.stats["rows"] += len(joining)
                    self.stats["joined"] += len(joining)
                    parts.append(wave.admit(joining, self._shared_len(joining)))
                    active += joining
                logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        except BaseException as e:
            for r in active + joining:  # joined rows are not in the list the caller fails (each is told once)
                r.resolve(False, e)
            raise

    def _join(self, room: int) -> list[_Request]:
        """Up to ``room`` requests already queued (no wait): they join the running batch."""
        joining: list[_Request] = []
        if room > 0:
            self._take_up_to(joining, room)
        return joining

    @staticmethod
    def _shared_len(reqs: list[_Request]) -> int:
        """How many leading prompt tokens every row of the wave shares (a chat template's opening,
        a system prompt), run once for the wave; 0 below 2 (or for a one-row wave). Each row keeps
        at least one token of its own for the batched prefill, which yields its first logits."""
        if len(reqs) < 2:
            return 0
        return shared_start(reqs[0].prompt_ids, [r.prompt_ids for r in reqs])

    def _sample(self, reqs: list[_Request], logits: torch.Tensor) -> list[tuple[int, float]]:
        """Draw one token per row from its tempered distribution; return (token, log-prob) pairs.

        An untruncated row draws by inverse CDF: one uniform from the row's own generator (seeded
        requests) or the engine's, then one vectorised search of the rows' cumulative probabilities
        (``torch.multinomial`` costs ~4x more on a 49k vocabulary, and a call per row ~100x more on
        a small model). Each uniform is drawn on its generator's device (a CUDA generator cannot
        fill a CPU tensor)."""
        temps = torch.tensor([r.options.temperature for r in reqs], dtype=torch.float32, device=logits.device)
        scaled = logits.float() / temps[:, None]
        lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
        out: list[tuple[int, float] | None] = [None] * len(reqs)
        plain = [i for i, r in enumerate(reqs) if _untruncated(r.options)]
        if plain:
            rows, row_lse = (scaled, lse) if len(plain) == len(reqs) else (scaled[plain], lse[plain])
            u = torch.cat(
                [
                    torch.rand(1, generator=g, device=g.device)
                    for g in (reqs[i].generator or self._gen for i in plain)
                ]
            ).to(rows.device)
            cdf = torch.exp(rows - row_lse).cumsum(dim=-1)
            draws = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(
                max=rows.shape[1] - 1
            )
            picked = rows.gather(1, draws).squeeze(1) - row_lse.squeeze(1)
            for i, tok, lp in zip(
                plain, draws.squeeze(1).tolist(), picked.tolist(), strict=True
            ):  # one copy, not one per row
                if math.isfinite(lp):  # else (float rounding at the very top) drawn below
                    out[i] = (tok, lp)
        for i, r in enumerate(reqs):
            if out[i] is not None:
                continue
            row = _truncate(scaled[i] - lse[i], r.options)
            tok = int(torch.multinomial(row.exp(), 1, generator=r.generator or self._gen))
            out[i] = (tok, float(row[tok]))
        return out  # type: ignore[return-value]

    @staticmethod
    def _record_entropies(reqs: list[_Request], logits: torch.Tensor) -> None:
        """Append, for each row whose request asked for entropies, the entropy (nats) of the tempered
        distribution its token was just drawn from; rows that did not ask cost nothing."""
        want = [i for i, r in enumerate(reqs) if r.options.entropies]
        if not want:
            return
        temps = torch.tensor(
            [reqs[i].options.temperature for i in want], dtype=torch.float32, device=logits.device
        )
        logp = torch.log_softmax(logits[want].float() / temps[:, None], dim=-1)
        ent = -(logp.exp() * logp).nan_to_num().sum(dim=-1)  # 0 * -inf (a masked token) counts as 0
        for i, h in zip(want, ent.tolist(), strict=True):
            reqs[i].entropies.append(h)

    def _finished(self, r: _Request) -> str | None:
        o = r.options
        if r.token_ids[-1] in o.stop_token_ids:
            return "stop"
        if o.stop_strings and self.tokenizer is not None:
            longest = max(len(s) for s in o.stop_strings)
            tail = self.tokenizer.decode(r.token_ids[-(longest + 8) :], skip_special_tokens=False)
            if any(s in tail for s in o.stop_strings):
                return "stop"
        if len(r.token_ids) >= o.max_tokens:
            return "length"
        return None


class _TransformersWave:
    """A wave through transformers' forward: left-padded prompts after the shared opening (run
    once as a one-row forward whose cache is repeated for the rows; the padding sits between it
    and each row's rest, masked out, with the positions running on from it) and its DynamicCache.
    Its rows' keys and values are not kept for continuations (:meth:`keep` does nothing)."""

    joinable = False  # its left-padded cache has no place for a newcomer's prompt

    def __init__(self, engine: HFEngine, reqs: list[_Request], shared: int) -> None:
        from transformers import DynamicCache

        self.model, dev = engine.model, engine.device
        self.cache = DynamicCache(config=self.model.config)
        if shared and hasattr(self.cache, "batch_repeat_interleave"):
            self.model(
                input_ids=torch.tensor([reqs[0].prompt_ids[:shared]], dtype=torch.long, device=dev),
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
            self.cache.batch_repeat_interleave(len(reqs))
        else:
            shared = 0
        self.shared = shared
        rests = [r.prompt_ids[shared:] for r in reqs]
        longest = max(len(x) for x in rests)
        self.input_ids = torch.full((len(reqs), longest), engine.pad_id, dtype=torch.long, device=dev)
        self.mask = torch.zeros((len(reqs), shared + longest), dtype=torch.long, device=dev)
        self.mask[:, :shared] = 1
        for i, rest in enumerate(rests):
            self.input_ids[i, longest - len(rest) :] = torch.tensor(rest, dtype=torch.long, device=dev)
            self.mask[i, shared + longest - len(rest) :] = 1
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        engine.stats["prefill_tokens"] += shared + sum(len(x) for x in rests)

    def keep(self, row: int, req: _Request, version: int) -> None:
        """Nothing is kept (see the class docstring)."""

    def first_logits(self) -> torch.Tensor:
        out = self.model(
            input_ids=self.input_ids,
            attention_mask=self.mask,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.next_pos = self.positions[:, -1:] + 1
        return out.logits[:, -1, :]

    def select(self, keep: list[int]) -> list[int]:
        """Keep rows ``keep`` (ascending), in that order; returns it (the new row order)."""
        rows = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(rows)
        self.mask = self.mask.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)
        return keep

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(
            input_ids=last[:, None],
            attention_mask=self.mask,
            position_ids=self.next_pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :]


SLOT_STEP = 256
"""A compact wave's cache grows its token slots in steps of this many (see :meth:`_CompactWave._slots`)."""


class _CompactWave:
    """A running batch through :mod:`fr_agents.models.compact` that requests join and leave.

    Its :class:`CompactCache` starts with a row per first request and grows (doubling, up to the
    engine's ``max_batch_size`` places) when joins need more; the live rows are always the first
    ones. A finished row's place is taken by a live row from the end (:meth:`select` copies that one
    row's cache), and queued requests join between two decode steps (:meth:`admit`: their prompts
    are prefilled right into the next free rows, the shared opening once), so the batch stays full
    while episodes come and go instead of draining to its slowest row. Each row's tokens sit in its
    own slots; a newcomer longer than the slots adds some."""

    joinable = True

    def __init__(self, engine: HFEngine, reqs: list[_Request], shared: int) -> None:
        self.engine, self.model, self.device = engine, engine.model, engine.device
        # rows for the first requests; joins add rows as they need them, up to max_batch_size
        self.cache = CompactCache(self.model, len(reqs), self._slots(reqs), self.device)
        self.live = 0
        self.shared = shared
        self.first = reqs

    @staticmethod
    def _slots(reqs: list[_Request]) -> int:
        """Token slots a row needs, rounded up to :data:`SLOT_STEP`: a multi-turn episode's prompt
        grows every turn, and a cache regrown by a few slots each time leaves its old blocks to the
        allocator, whose heap then only grows (the slots past a row's length are never read)."""
        need = max(len(r.prompt_ids) + r.options.max_tokens for r in reqs)
        return -(-need // SLOT_STEP) * SLOT_STEP

    def first_logits(self) -> torch.Tensor:
        return self.admit(self.first, self.shared)

    def admit(self, reqs: list[_Request], shared: int) -> torch.Tensor:
        """Prefill ``reqs`` into the next free rows; their first logits ``[len(reqs), V]``.

        A request that continues a kept row (:class:`~fr_agents.policy.opening.Continuations`)
        prefills only what follows that row's tokens (:meth:`_continue`: all such requests of the
        join in one forward). The others prefill together: what every prompt starts with of the
        engine's kept :class:`Opening` is not computed again (its keys and values are copied in);
        what the group shares beyond it runs once; a longer opening this group shares is kept for
        the joins after it. ``reqs`` is reordered in place to the rows' order (the fresh group
        first, then the continuations); ``shared`` is what all of ``reqs`` share."""
        need = self.live + len(reqs)
        rows = min(self.engine.max_batch_size, max(need, 2 * self.cache.keys[0].shape[0]))
        self.cache.grow(rows, self._slots(reqs))
        opening = self.engine.opening
        found = {id(r): self.engine.continuations.find(r.prompt_ids) for r in reqs}
        goes_on = {id(r): found[id(r)][0] > opening.match([r.prompt_ids]) for r in reqs}
        fresh = [r for r in reqs if not goes_on[id(r)]]
        going_on = [r for r in reqs if goes_on[id(r)]]
        parts = []
        if fresh:
            if len(fresh) < len(reqs):
                shared = HFEngine._shared_len(fresh)
            parts.append(self._prefill(fresh, shared))
        if going_on:
            parts.append(self._continue(going_on, [found[id(r)] for r in going_on]))
        reqs[:] = fresh + going_on
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _continue(self, reqs: list[_Request], found: list[tuple[int, Past]]) -> torch.Tensor:
        """Prefill ``reqs``, each continuing the kept row ``found`` ``(tokens, keys and values)``
        its prompt starts with, into the next free rows: each row's kept keys and values are copied
        into its place, then what follows them runs for all the rows in one forward
        (:func:`~fr_agents.models.compact.compact_extend`)."""
        rows = self.cache.rows(self.live, self.live + len(reqs))
        for g, (n, past) in enumerate(found):
            for layer, (k, v) in enumerate(zip(past.keys, past.values, strict=True)):
                rows.keys[layer][g, :, :n] = k
                rows.values[layer][g, :, :n] = v
            rows.lengths[g] = n
            self.engine.stats["continued_tokens"] += n
        lengths = [len(r.prompt_ids) - n for r, (n, _) in zip(reqs, found, strict=True)]
        ids = torch.full((len(reqs), max(lengths)), self.engine.pad_id, dtype=torch.long, device=self.device)
        for i, (r, (n, _)) in enumerate(zip(reqs, found, strict=True)):
            ids[i, : lengths[i]] = torch.tensor(r.prompt_ids[n:], dtype=torch.long, device=self.device)
        logits = compact_extend(
            self.model,
            ids,
            torch.tensor(lengths, dtype=torch.long, device=self.device),
            rows,
            self.engine.fused(),
        )
        self.engine.stats["prefill_tokens"] += sum(lengths)
        self.live += len(reqs)
        return logits

    def _prefill(self, reqs: list[_Request], shared: int) -> torch.Tensor:
        """Prefill ``reqs`` into the next free rows, after the kept opening they start with."""
        opening = self.engine.opening
        kept = opening.match([r.prompt_ids for r in reqs])
        past = opening.past(self.model, kept, self.engine.fused()) if kept else None
        self.engine.stats["opening_tokens"] += kept * len(reqs)
        lengths = [len(r.prompt_ids) - kept for r in reqs]
        ids = torch.full((len(reqs), max(lengths)), self.engine.pad_id, dtype=torch.long, device=self.device)
        for i, r in enumerate(reqs):
            ids[i, : lengths[i]] = torch.tensor(r.prompt_ids[kept:], dtype=torch.long, device=self.device)
        rows = self.cache.rows(self.live, self.live + len(reqs))
        prefix = max(0, shared - kept)
        logits = compact_prefill(
            self.model,
            ids,
            torch.tensor(lengths, dtype=torch.long, device=self.device),
            prefix,
            rows,
            self.engine.fused(),
            past,
        )
        self.engine.stats["prefill_tokens"] += prefix + sum(n - prefix for n in lengths)
        if shared > kept:
            opening.remember(
                reqs[0].prompt_ids[:shared],
                Past(
                    [k[0, :, :shared].clone() for k in rows.keys],
                    [v[0, :, :shared].clone() for v in rows.values],
                ),
            )
        self.live += len(reqs)
        return logits

    def keep(self, row: int, req: _Request, version: int) -> None:
        """Row ``row`` finished: keep its keys and values (its prompt and all but its last sampled
        token) for a request that continues it, when every token of it ran on the live weights."""
        if self.engine.continuations.max_tokens == 0 or any(v != version for v in req.versions):
            return
        n = int(self.cache.lengths[row])
        tokens = (req.prompt_ids + req.token_ids)[:n]
        self.engine.continuations.keep(
            tokens,
            Past(
                [k[row, :, :n].clone() for k in self.cache.keys],
                [v[row, :, :n].clone() for v in self.cache.values],
            ),
        )

    def select(self, keep: list[int]) -> list[int]:
        """Keep rows ``keep`` (ascending) as the first ``len(keep)`` rows: each finished place among
        them takes a kept row from beyond them. Returns the old row of each new row."""
        m = len(keep)
        kept = set(keep)
        holes = [i for i in range(m) if i not in kept]
        movers = [i for i in keep if i >= m]
        order = list(range(m))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            self.cache.move(torch.tensor(movers, device=self.device), torch.tensor(holes, device=self.device))
        self.live = m
        return order

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        return compact_decode(self.model, last, self.cache.rows(0, self.live), self.engine.fused())


def _untruncated(o: SamplingOptions) -> bool:
    return o.top_k == 0 and o.top_p >= 1.0


def _truncate(logp: torch.Tensor, o: SamplingOptions) -> torch.Tensor:
    """Apply top-k/top-p (only reachable with importance correction off) and renormalise."""
    if _untruncated(o):
        return logp
    keep = torch.ones_like(logp, dtype=torch.bool)
    if o.top_k > 0:
        kth = torch.topk(logp, min(o.top_k, logp.numel())).values[-1]
        keep &= logp >= kth
    if o.top_p < 1.0:
        sorted_lp, order = torch.sort(logp, descending=True)
        cum = sorted_lp.exp().cumsum(0)
        drop_sorted = (cum - sorted_lp.exp()) >= o.top_p
        drop = torch.zeros_like(keep)
        drop[order] = drop_sorted
        keep &= ~drop
    masked = logp.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(masked, dim=-1)
