"""The learner: exactly one optimizer step per fresh batch of complete trajectories.

``Learner.step(batch)`` takes a :class:`~fr_agents.tree.batch.FlatBatch` (one ``[B, T]`` row per
trajectory) or a :class:`~fr_agents.tree.batch.PackedBatch` (every shared prefix token laid out once,
plus the index map back to rows) and

1. recomputes the current log-probs with the model at the *sampling temperature* (the behaviour
   log-probs were recorded after temperature, so the ratio compares like with like);
2. computes the advantages once on the full batch (centred rewards, or GRPO group-normalised);
3. runs the objective over micro-batches of rows chosen by a token budget, passing the full-batch
   advantages and denominators (``B``, ``T_i``, total tokens), and accumulates the gradients, so the
   step does not depend on the micro-batch size;
4. refuses a non-finite loss or gradient (:class:`NonFiniteLossError`) *before* stepping;
5. clips the gradient norm, takes one optimizer step, marks the batch consumed (a second use raises)
   and returns the step's statistics.

A packed batch is run root by root: each root's packed subtree is one row of a padded ``[R, W]``
forward with explicit position ids, and the roots are grouped by the token budget like flat
micro-batches, so memory grows with the sum over roots, not with the square of the batch. Inside a
row each token attends to its own path only: by tree attention (:mod:`fr_agents.tree.attention`,
block-sparse, no ``[W, W]`` mask, for models that pick their attention through transformers'
interface and run sdpa) where it computes at least ``tree_min_saving`` times fewer scores than the
dense mask (wide rows of many branches), else by a float additive ``[W, W]`` mask (short rows,
where the mask is cheaper than tree attention's gathers). It takes this path when its
largest root fits the budget (or ``packed="always"``); otherwise its flat view is micro-batched.
All give the same loss and gradients.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from fr_agents.config import ALGOS, AUTOCAST_DTYPES, BASELINES, PACKED_MODES, OptimConfig, TrainConfig
from fr_agents.models.compact import compact_logits, compact_reason
from fr_agents.tree.attention import (
    TREE_MIN_SAVING,
    supports_tree_attention,
    tree_attention,
    tree_attention_pays,
)
from fr_agents.tree.batch import token_logprobs
from trainer.objective import (
    centered_advantages,
    compute_dtype,
    denominators,
    flashreinforce_loss,
    group_normalized_advantages,
    grpo_loss,
    tree_advantages,
    validate_aggregation,
    validate_delta,
    validate_fraction,
    validate_min_prob,
    validate_min_prob_scope,
    validate_weights,
)
from trainer.spike_clip import SpikeClip

logger = logging.getLogger(__name__)

Tensor = torch.Tensor



class NonFiniteLossError(FloatingPointError):
    """The loss or the gradient norm of a step is NaN/inf. Raised before the optimizer steps.

    The gradients are zeroed and the batch is *not* consumed, so the training loop can save the
    batch (``.batch``) for inspection and stop. ``.stats`` holds what was computed so far.
    """

    def __init__(self, message: str, batch: Any = None, stats: dict[str, float] | None = None):
        super().__init__(message)
        self.batch = batch
        self.stats = stats or {}


def make_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up for ``optim.warmup_steps``, then constant, linear or cosine decay to 0."""
    warmup = max(0, optim.warmup_steps)
    total = max(1, total_steps)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if optim.scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if optim.scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _is_packed(batch: Any) -> bool:
    return hasattr(batch, "flat") and hasattr(batch, "prev_index")


def _entropy(scaled: Tensor) -> Tensor:
    """Entropy of ``softmax(scaled)`` along the last axis (no gradient)."""
    with torch.no_grad():
        logp = torch.log_softmax(scaled, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)


def _fusable(params: list[Tensor]) -> bool:
    """Whether AdamW can take its fused kernel: one update per parameter instead of ~10 elementwise
    ops (3x less optimizer time for a small model on CPU; the same update up to float rounding)."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def _shared_prefix(ids: Tensor, attn: Tensor, limit: int) -> int:
    """How many leading columns (at most ``limit``) hold the same real token in every row."""
    same = ((ids == ids[:1]) & attn).all(dim=0)[:limit]
    if bool(same.all()):
        return int(same.shape[0])
    return int(torch.argmin(same.to(torch.int8)))


def policy_logits(
    model: torch.nn.Module, ids: Tensor, attn: Tensor, action_mask: Tensor, compact: bool = False
) -> tuple[int, Tensor]:
    """The logits a step needs for rows ``ids`` [B, W]: ``(first, logits)`` where ``logits[:, j]``
    predicts column ``first + j`` and ``first`` is the first column holding a policy token.

    Two exact savings over ``model(ids).logits``, both of which leave the loss and its gradient
    unchanged (tested against the plain forward):

    * **only the columns that can hold a policy token** go through the output head (most of a
      row is prompt and observation; the head and its log-softmax are a large share of a small
      model's work);
    * **a prefix every row shares** (a chat template's opening, a system prompt) is run once, as
      a one-row forward whose key/value cache is repeated for the batch; autograd sums the rows'
      gradients back through the repeat. The prefix stops before the first policy token.

    ``compact``: the caller checked :func:`~fr_agents.models.compact.compact_reason`; right-padded
    rows then take :func:`~fr_agents.models.compact.compact_logits`, which also runs the last layer
    only at the kept columns (the same logits and gradients up to float rounding, tested).

    A model without ``logits_to_keep`` or a repeatable cache gets the plain forward. A float64
    model never shares the prefix: float64 is the reference precision of the equality tests, and
    transformers' RMSNorm computes in float32, so summing the rows' gradients before it instead
    of after it moves a float64 gradient by ~1e-9 (a float32 one by less than its own rounding).
    """
    b, w = ids.shape
    cols = action_mask.any(dim=0).nonzero()
    first = int(cols[0]) if cols.numel() else w - 1
    first = max(1, first)
    keep = torch.arange(first - 1, w - 1, device=ids.device)
    exact = next(model.parameters()).dtype == torch.float64
    prefix = _shared_prefix(ids, attn, first - 1) if b > 1 and not exact else 0
    if compact and bool((attn[:, 1:] <= attn[:, :-1]).all()):  # right-padded rows
        return first, compact_logits(model, ids, keep, prefix if prefix >= 2 else 0)
    try:
        if prefix >= 2:
            head = model(input_ids=ids[:1, :prefix], use_cache=True, logits_to_keep=1)
            cache = head.past_key_values
            if hasattr(cache, "batch_repeat_interleave"):
                cache.batch_repeat_interleave(b)
                positions = torch.arange(prefix, w, device=ids.device)
                out = model(
                    input_ids=ids[:, prefix:],
                    attention_mask=attn.long(),
                    past_key_values=cache,
                    position_ids=positions.expand(b, -1),
                    cache_position=positions,
                    logits_to_keep=keep - prefix,
                    use_cache=False,
                )
                return first, out.logits
        out = model(input_ids=ids, attention_mask=attn.long(), logits_to_keep=keep)
        return first, out.logits
    except TypeError:  # a model whose forward takes neither
        return first, model(input_ids=ids, attention_mask=attn.long()).logits[:, first - 1 : w - 1]


class Learner:
    """One optimizer step per fresh batch (see the module docstring).

    Args:
        model: a causal LM returning ``.logits`` (a transformers model).
        optimizer: defaults to ``AdamW(lr, betas, weight_decay)``.
        temperature: the sampling temperature the rollouts used.
        algo: ``"flashreinforce"`` or ``"grpo"``.
        delta, importance_sampling, aggregation, negative_token_fraction, negative_min_prob,
            negative_min_prob_scope: the FlashREINFORCE switches (:func:`trainer.objective.flashreinforce_loss`).
        grpo_group_size, grpo_clip: the GRPO baseline; groups are the batch's ``root_ids`` when
            present, else consecutive runs of ``grpo_group_size`` rows.
        micro_batch_tokens: token budget of one forward (rows x padded length); <= 0 means one
            micro-batch.
        baseline: ``"batch"`` (FlashREINFORCE's batch mean) or ``"tree"`` (also against the mean
            of the rows sharing a row's branching node, :func:`trainer.objective.tree_advantages`;
            uses the batch's ``branch_rows``).
        grad_clip: max gradient norm; <= 0 disables clipping (the norm is still reported).
        spike_clip: > 0: also clip the gradient norm to this multiple of the median of the last
            ``spike_window`` non-zero gradient norms (:mod:`trainer.spike_clip`: a batch far
            above the recent scale would otherwise move Adam, and its momentum, far); 0: off.
        spike_window: how many recent gradient norms that median is taken over.
        packed: ``"auto"`` (packed forward when it fits the budget), ``"always"`` or ``"never"``.
        tree_attention: packed forwards may use block-sparse tree attention when the model
            supports it (:func:`~fr_agents.tree.attention.supports_tree_attention`); False: the
            dense per-root mask always (same result, attention cost ``W**2`` per root).
        tree_min_saving: a chunk of roots takes tree attention only when the dense mask would
            compute at least this many times its scores
            (:func:`~fr_agents.tree.attention.tree_attention_pays`; short rows are faster under
            the dense mask); <= 0: whenever the model supports it.
        scheduler: an LR scheduler stepped after every optimizer step.
        version: the policy version of the current weights; +1 per step.
        before_micro_batch: a hook called before every flat micro-batch of a step (the elastic
            runtime hands a step the train slots that joined while it ran); None: nothing.
        compact_forward: flat steps use :func:`~fr_agents.models.compact.compact_logits` where
            :func:`~fr_agents.models.compact.compact_reason` allows (``.compact_reason`` then is
            None, else it says why not); False: transformers' forward always.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        temperature: float = 1.0,
        algo: str = "flashreinforce",
        delta: float = 3e-3,
        importance_sampling: bool = True,
        aggregation: str = "sample_mean",
        negative_token_fraction: float = 1.0,
        negative_min_prob: float = 0.0,
        negative_min_prob_scope: str = "token",
        grpo_group_size: int = 4,
        grpo_clip: float = 0.2,
        micro_batch_tokens: int = 8192,
        grad_clip: float = 1.0,
        spike_clip: float = 0.0,
        spike_window: int = 50,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        packed: str = "auto",
        tree_attention: bool = True,
        tree_min_saving: float = TREE_MIN_SAVING,
        baseline: str = "batch",
        scheduler: Any = None,
        version: int = 0,
        before_micro_batch: Callable[[], None] | None = None,
        compact_forward: bool = True,
        autocast: str = "",
    ) -> None:
        if algo not in ALGOS:
            raise ValueError(f"algo: expected one of {ALGOS}, got {algo!r}")
        if packed not in PACKED_MODES:
            raise ValueError(f"packed: expected one of {PACKED_MODES}, got {packed!r}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline: expected one of {BASELINES}, got {baseline!r}")
        if not temperature > 0:
            raise ValueError(f"temperature: must be > 0, got {temperature!r}")
        validate_delta(delta)
        validate_fraction(negative_token_fraction)
        validate_min_prob(negative_min_prob)
        validate_min_prob_scope(negative_min_prob_scope)
        validate_aggregation(aggregation)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer or torch.optim.AdamW(
            self.params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=_fusable(self.params)
        )
        self.scheduler = scheduler
        self.temperature = float(temperature)
        self.algo = algo
        self.delta = float(delta)
        self.importance_sampling = importance_sampling
        self.aggregation = aggregation
        self.negative_token_fraction = float(negative_token_fraction)
        self.negative_min_prob = float(negative_min_prob)
        self.negative_min_prob_scope = negative_min_prob_scope
        self.grpo_group_size = grpo_group_size
        self.grpo_clip = grpo_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.grad_clip = grad_clip
        self.spike = SpikeClip(spike_clip, spike_window) if spike_clip > 0 else None
        self.packed = packed
        self.tree_attention = tree_attention and supports_tree_attention(model)
        self.tree_min_saving = float(tree_min_saving)
        self.baseline = baseline
        self.version = version
        self.before_micro_batch = before_micro_batch
        if autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast: expected one of {AUTOCAST_DTYPES}, got {autocast!r}")
        self.autocast = autocast
        self.compact_reason = compact_reason(model) if compact_forward else "model.compact_forward is false"
        if self.compact_reason is None:
            logger.info("learner: flat steps run the compact forward (fr_agents.models.compact)")
        else:
            logger.info("learner: transformers' forward (no compact forward: %s)", self.compact_reason)

    @classmethod
    def from_config(
        cls,
        model: torch.nn.Module,
        cfg: TrainConfig,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        before_micro_batch: Callable[[], None] | None = None,
    ) -> Learner:
        """A learner with every switch taken from ``cfg`` (objective, optim, rollout temperature)."""
        o, opt = cfg.objective, cfg.optim
        learner = cls(
            model,
            optimizer,
            temperature=cfg.rollout.temperature,
            algo=o.algo,
            delta=o.delta,
            importance_sampling=o.importance_sampling,
            aggregation=o.aggregation,
            negative_token_fraction=o.negative_token_fraction,
            negative_min_prob=o.negative_min_prob,
            negative_min_prob_scope=o.negative_min_prob_scope,
            grpo_group_size=o.grpo_group_size,
            grpo_clip=o.grpo_clip,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens,
            grad_clip=opt.grad_clip,
            spike_clip=opt.spike_clip,
            spike_window=opt.spike_window,
            lr=opt.lr,
            betas=(float(opt.betas[0]), float(opt.betas[1])),
            weight_decay=opt.weight_decay,
            packed=cfg.trainer.packed,
            baseline=o.baseline,
            before_micro_batch=before_micro_batch,
            compact_forward=cfg.model.compact_forward,
            autocast=cfg.trainer.autocast,
        )
        if opt.scheduler != "constant" or opt.warmup_steps:
            learner.scheduler = make_scheduler(learner.optimizer, opt, cfg.trainer.steps)
        return learner

    # ----------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, version and the spike clip's norm history (the model's weights
        are saved separately)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "version": self.version,
            "spike_clip": self.spike.state_dict() if self.spike is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        if self.spike is not None and state.get("spike_clip") is not None:
            self.spike.load_state_dict(state["spike_clip"])

    # ----------------------------------------------------------------------- the step

    @property
    def _filtering(self) -> bool:
        return self.algo == "flashreinforce" and self.negative_token_fraction < 1.0

    def step(self, batch: Any) -> dict[str, float]:
        """Recompute log-probs, accumulate the loss gradient, clip, take one optimizer step.

        Raises:
            RuntimeError: the batch was already consumed by a step.
            ValueError: the batch is malformed (the message names the field).
            NonFiniteLossError: the loss or gradient is NaN/inf (nothing was stepped).
        """
        if batch.consumed:
            raise RuntimeError("batch: already consumed by a learner step (one step per fresh batch)")
        started = time.perf_counter()
        packed_input = _is_packed(batch)
        flat = batch.flat if packed_input else batch
        self._validate_flat(flat)
        device = self.params[0].device if self.params else torch.device("cpu")
        action_mask = flat.action_mask.to(device)
        rewards = flat.rewards.to(device)
        weights = self._weights(flat, device)
        try:
            advantages = self._advantages(flat, rewards, weights)
        except NonFiniteLossError as e:
            e.batch = batch
            raise
        num_rows, num_tokens = denominators(action_mask, weights)  # the full batch's, for every chunk

        use_packed = packed_input and self._fits_packed(batch)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            if use_packed:
                chunks = self._packed_chunks(batch, advantages, weights, num_rows, num_tokens, device)
            else:
                chunks = []
                for rows in self._micro_batches(flat.attention_mask):
                    if self.before_micro_batch is not None:
                        self.before_micro_batch()
                    chunks.append(self._flat_chunk(flat, rows, advantages, weights, num_rows, num_tokens, device))
        except NonFiniteLossError as e:
            self.optimizer.zero_grad(set_to_none=True)
            e.batch = batch
            raise
        except FloatingPointError as e:  # an admitted importance ratio overflowed
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"{e} at version {self.version}", batch) from e
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        stats = self._merge_stats(chunks, flat, rewards, advantages)
        stats["packed"] = float(use_packed)
        # the share of the packed forwards (root chunks) that ran tree attention
        stats["tree_attention"] = (
            sum(c["tree_attention"] for c in chunks) / len(chunks) if use_packed and chunks else 0.0
        )
        loss = stats["loss"]
        if not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"non-finite loss {loss} at version {self.version}", batch, stats)
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        stats["grad_norm"] = grad_norm  # before any clipping
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"non-finite gradient norm at version {self.version}", batch, stats)
        fixed = self.grad_clip if self.grad_clip and self.grad_clip > 0 else math.inf
        spike_bound = self.spike.bound() if self.spike is not None else math.inf
        stats["spike_clipped"] = float(grad_norm > spike_bound and spike_bound < fixed)  # the spike clip cut it
        max_norm = min(fixed, spike_bound)
        if grad_norm > max_norm:
            torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, torch.tensor(grad_norm))
        if self.spike is not None:
            self.spike.record(grad_norm)
        stats["lr"] = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        batch.mark_consumed()
        self.version += 1
        stats["version"] = float(self.version)
        stats["step_seconds"] = time.perf_counter() - started
        logger.info(
            "step %d loss=%.4g accept=%.3f kl_mean=%.3g kl_max=%.3g ratio_mean=%.3f ratio_max=%.3f "
            "adv_std=%.3g retained=%.3f grad_norm=%.3g",
            self.version,
            loss,
            stats["acceptance_rate"],
            stats["seq_kl_mean"],
            stats["seq_kl_max"],
            stats["ratio_mean"],
            stats["ratio_max"],
            stats["adv_std"],
            stats["retained_fraction"],
            grad_norm,
        )
        return stats

    def skip_step(self) -> dict[str, float]:
        """A step with nothing to train on (every episode of its batch aborted, see DESIGN.md
        "Infrastructure failures"): the weights and the optimizer's state stay as they are, the
        version still advances (batch ``k`` is trained at version ``k``, and the rollout waits for
        version ``k + 1 - max_policy_lag``), and the learning-rate schedule counts the step."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.version += 1
        logger.warning("step %d: no leaf to train on (every episode of the batch aborted); weights unchanged", self.version)
        return {"version": float(self.version), "lr": float(self.optimizer.param_groups[0]["lr"]), "skipped": 1.0}

    # ----------------------------------------------------------------------- helpers

    @staticmethod
    def _validate_flat(flat: Any) -> None:
        ids = flat.token_ids
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError("token_ids: expected a LongTensor [B, T]")
        shape = tuple(ids.shape)
        for name in ("behavior_logprobs", "action_mask", "attention_mask"):
            t = getattr(flat, name)
            if not isinstance(t, Tensor) or tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {list(shape)}")
        for name in ("action_mask", "attention_mask"):
            if getattr(flat, name).dtype != torch.bool:
                raise ValueError(f"{name}: expected dtype torch.bool")
        if bool((flat.action_mask & ~flat.attention_mask).any()):
            raise ValueError("action_mask: a policy token lies outside attention_mask")
        if bool(flat.action_mask[:, 0].any()):
            raise ValueError(
                "action_mask: the first token of a row has no context and cannot be a policy token"
            )
        if not isinstance(flat.rewards, Tensor) or tuple(flat.rewards.shape) != shape[:1]:
            raise ValueError(f"rewards: expected shape [{shape[0]}]")

    @staticmethod
    def _weights(flat: Any, device: torch.device) -> Tensor | None:
        """The batch's row weights (sampled leaves per row, float64 on ``device``), or None."""
        weights = getattr(flat, "weights", None)
        if weights is None:
            return None
        validate_weights(weights, flat.token_ids.shape[0], getattr(weights, "device", device))
        return weights.to(device=device, dtype=torch.float64)

    def _advantages(self, flat: Any, rewards: Tensor, weights: Tensor | None = None) -> Tensor:
        r = rewards.to(torch.float64)
        if self.algo == "flashreinforce":
            if not bool(torch.isfinite(r).all()):
                raise ValueError("rewards: every reward must be finite")
            if self.baseline == "tree":
                groups = list(getattr(flat, "branch_rows", None) or [])
                if len(groups) != r.shape[0]:
                    raise ValueError("branch_rows: baseline=tree needs each row's branching subtree (build the batch from the tree)")
                return self._finite(tree_advantages(r, groups, weights))
            return self._finite(centered_advantages(r, weights))
        roots = list(getattr(flat, "root_ids", None) or [])
        groups: Any = roots if len(roots) == r.shape[0] else None
        if groups is None:
            if r.shape[0] % self.grpo_group_size:
                raise ValueError(
                    f"root_ids: missing, and grpo_group_size={self.grpo_group_size} does not divide "
                    f"the batch of {r.shape[0]} rows"
                )
            groups = torch.arange(r.shape[0], device=r.device) // self.grpo_group_size
        return self._finite(group_normalized_advantages(r, groups, weights=weights))

    @staticmethod
    def _finite(advantages: Tensor) -> Tensor:
        if not bool(torch.isfinite(advantages).all()):
            raise NonFiniteLossError("advantages: non-finite (the reward statistics overflowed)")
        return advantages

    def _micro_batches(self, attention_mask: Tensor) -> list[Tensor]:
        """Row chunks whose ``rows x padded length`` fits the token budget (longest rows first)."""
        t = attention_mask.shape[1]
        positions = torch.arange(1, t + 1).expand_as(attention_mask)
        lengths = (positions * attention_mask.cpu()).max(dim=1).values
        order = torch.argsort(lengths, descending=True, stable=True)
        if self.micro_batch_tokens <= 0:
            return [order]
        chunks: list[list[int]] = []
        current: list[int] = []
        for row in order.tolist():
            width = int(lengths[current[0]]) if current else int(lengths[row])
            if current and (len(current) + 1) * width > self.micro_batch_tokens:
                chunks.append(current)
                current = []
            current.append(row)
        chunks.append(current)
        return [torch.tensor(c, dtype=torch.long) for c in chunks]

    def _autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The forward's products in ``autocast``'s dtype (``trainer.autocast``); parameters, their
        gradients and the optimizer stay in theirs, and the backward runs outside (as torch asks)."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=getattr(torch, self.autocast))

    def _scale(self, logits: Tensor) -> Tensor:
        """Logits at the sampling temperature, in the objective's precision (no division at 1)."""
        logits = logits.to(compute_dtype(logits))
        return logits if self.temperature == 1.0 else logits / self.temperature

    def _check_current(self, log_probs: Tensor, action_mask: Tensor) -> None:
        """The model's own log-probs must be finite on policy tokens (else the weights diverged)."""
        if not bool(torch.isfinite(log_probs.detach()[action_mask]).all()):
            raise NonFiniteLossError(f"the model gives non-finite log-probs at version {self.version}")

    def _objective(
        self,
        log_probs: Tensor,
        behavior: Tensor,
        rewards: Tensor,
        action_mask: Tensor,
        advantages: Tensor,
        entropies: Tensor | None,
        failures: Tensor | None,
        weights: Tensor | None,
        num_rows: float,
        num_tokens: float,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if self.algo == "grpo":
            return grpo_loss(
                log_probs,
                behavior,
                rewards,
                action_mask,
                clip_eps=self.grpo_clip,
                advantages=advantages,
                num_tokens=num_tokens,
                weights=weights,
            )
        return flashreinforce_loss(
            log_probs,
            behavior,
            rewards,
            action_mask,
            delta=self.delta,
            negative_token_fraction=self.negative_token_fraction,
            negative_min_prob=self.negative_min_prob,
            negative_min_prob_scope=self.negative_min_prob_scope,
            entropies=entropies,
            failures=failures,
            importance_sampling=self.importance_sampling,
            aggregation=self.aggregation,
            advantages=advantages,
            num_rows=num_rows,
            num_tokens=num_tokens,
            weights=weights,
        )

    def _failures(self, flat: Any, rows: Tensor | None, device: torch.device) -> Tensor | None:
        if not self._filtering:
            return None
        failures = getattr(flat, "failures", None)
        if not isinstance(failures, Tensor) or failures.dtype != torch.bool:
            raise ValueError("failures: the entropy filter needs explicit bool failure labels [B]")
        return (failures if rows is None else failures[rows]).to(device)

    def _flat_chunk(
        self, flat: Any, rows: Tensor, advantages: Tensor, weights: Tensor | None, num_rows: float,
        num_tokens: float, device: torch.device,
    ) -> dict[str, Any]:
        """Forward + backward of one row chunk, trimmed to its longest real row."""
        am = flat.attention_mask[rows]
        width = int((torch.arange(1, am.shape[1] + 1) * am.cpu()).max())
        ids = flat.token_ids[rows, :width].to(device)
        attn = am[:, :width].to(device)
        action_mask = flat.action_mask[rows, :width].to(device)
        with self._autocast(device):
            first, logits = policy_logits(self.model, ids, attn, action_mask, compact=self.compact_reason is None)
        scaled = self._scale(logits)  # predicts columns first..width-1
        lp = torch.zeros(ids.shape, dtype=scaled.dtype, device=device)
        lp = torch.cat([lp[:, :first], token_logprobs(scaled, ids[:, first:])], dim=1)
        entropies = None
        if self._filtering:
            entropies = torch.cat([torch.zeros_like(lp[:, :first]), _entropy(scaled)], dim=1).detach()
        sub_rows = rows.to(device)
        self._check_current(lp, action_mask)
        loss, st = self._objective(
            lp,
            flat.behavior_logprobs[rows, :width].to(device),
            flat.rewards[rows].to(device),
            action_mask,
            advantages[sub_rows],
            entropies,
            self._failures(flat, rows, device),
            None if weights is None else weights[sub_rows],
            num_rows,
            num_tokens,
        )
        loss.backward()
        return {"rows": rows, "loss": loss.detach(), "stats": st, "forward_tokens": ids.numel()}

    # ----------------------------------------------------------------------- the packed path

    def _fits_packed(self, batch: Any) -> bool:
        """Whether a packed batch takes the per-root packed path: ``always``, or ``auto`` when its
        largest root fits the token budget (else its flat view is micro-batched)."""
        if self.packed == "always":
            return True
        if self.packed != "auto":
            return False
        return self.micro_batch_tokens <= 0 or batch.max_root_tokens <= self.micro_batch_tokens

    def _packed_chunks(
        self, batch: Any, advantages: Tensor, weights: Tensor | None, num_rows: float, num_tokens: float,
        device: torch.device,
    ) -> list[dict[str, Any]]:
        """Forward + backward of the packed batch, root group by root group (block-diagonal
        across roots, :meth:`~fr_agents.tree.batch.PackedBatch.root_chunks`)."""
        chunks = []
        for roots in batch.root_chunks(self.micro_batch_tokens):
            if self.before_micro_batch is not None:
                self.before_micro_batch()
            chunks.append(self._packed_chunk(batch, roots, advantages, weights, num_rows, num_tokens, device))
        return chunks

    def _packed_chunk(
        self, batch: Any, roots: list[int], advantages: Tensor, weights: Tensor | None, num_rows: float,
        num_tokens: float, device: torch.device,
    ) -> dict[str, Any]:
        """One forward over the packed tokens of ``roots`` (one padded row per root, each token
        attending to its own path); per-leaf log-probs are gathered from the flattened logits."""
        flat = batch.flat
        dtype = self.params[0].dtype if self.params else torch.float32
        layout = self._tree_layout(batch, roots)
        part = batch.root_chunk(roots, dtype, dense_mask=layout is None)
        rows, width = part["rows"], part["input_ids"].shape[1]
        # the output head runs only on the columns whose logits predict a policy token of some row
        # (as the flat path's policy_logits does); ``prev`` is re-indexed into those columns
        prev = part["prev"]
        keep = torch.unique(prev[flat.action_mask[rows]] % width)
        keep = keep if keep.numel() else torch.zeros(1, dtype=torch.long)
        column = torch.full((width,), -1, dtype=torch.long)
        column[keep] = torch.arange(keep.numel())
        kept = column[prev % width] >= 0  # [b, T]: tokens whose log-prob is computed
        prev = ((prev // width) * keep.numel() + column[prev % width].clamp(min=0)).to(device)
        with self._autocast(device):
            out, used_tree = self._packed_forward(batch, roots, part, layout, keep.to(device), dtype, device)
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        scaled = self._scale(logits)  # [R*K, V]
        lp = token_logprobs(scaled, flat.token_ids[rows].to(device), prev)  # [b, T]
        valid = flat.attention_mask[rows].to(device) & kept.to(device)
        valid[:, 0] = False
        lp = lp * valid
        entropies = _entropy(scaled)[prev] if self._filtering else None
        action_mask = flat.action_mask[rows].to(device)
        self._check_current(lp, action_mask)
        loss, st = self._objective(
            lp,
            flat.behavior_logprobs[rows].to(device),
            flat.rewards[rows].to(device),
            action_mask,
            advantages[rows.to(device)],
            entropies,
            self._failures(flat, rows, device),
            None if weights is None else weights[rows.to(device)],
            num_rows,
            num_tokens,
        )
        loss.backward()
        return {"rows": rows, "loss": loss.detach(), "stats": st, "forward_tokens": part["input_ids"].numel(),
                "tree_attention": used_tree}

    def _tree_layout(self, batch: Any, roots: list[int]) -> Any:
        """The tree-attention layout of a chunk of roots, or None when the chunk takes the dense
        per-root mask: the model cannot run tree attention, or it would not save
        ``tree_min_saving`` times the dense mask's scores (the exact count of allowed pairs
        rules most short chunks out before any layout is built)."""
        if not self.tree_attention:
            return None
        dense = len(roots) * batch.chunk_width(roots) ** 2
        if not tree_attention_pays(dense, batch.attention_pairs(roots), self.tree_min_saving):
            return None
        layout = batch.tree_layout(roots)
        return layout if tree_attention_pays(dense, layout.scores, self.tree_min_saving) else None

    def _packed_forward(
        self, batch: Any, roots: list[int], part: dict[str, Tensor], layout: Any, keep: Tensor,
        dtype: torch.dtype, device: torch.device,
    ) -> tuple[Any, bool]:
        """The model's output (logits of the ``keep`` columns) for one chunk of roots, and whether
        it ran tree attention: over ``layout`` when there is one, else the dense per-root mask of
        ``part`` (built here if missing)."""
        inputs = {"input_ids": part["input_ids"].to(device), "position_ids": part["position_ids"].to(device),
                  "logits_to_keep": keep}
        if layout is not None:
            layout = layout.to(device)
            with tree_attention(self.model):
                out = self.model(**inputs, tree_layout=layout)
            if layout.calls:
                return out, True
            # the model dropped the keyword, so that forward was plain causal attention: discard it
            logger.warning("%s does not pass attention keywords to its layers; packed steps use the dense mask",
                           type(self.model).__name__)
            self.tree_attention = False
            part = batch.root_chunk(roots, dtype)
        mask = part["attention_mask"].to(device)
        try:
            return self.model(**inputs, attention_mask=mask), False
        except TypeError:  # a model whose forward takes no logits_to_keep: keep the columns here
            del inputs["logits_to_keep"]
            out = self.model(**inputs, attention_mask=mask)
            out.logits = out.logits[:, keep]
            return out, False

    def _merge_stats(
        self, chunks: list[dict[str, Any]], flat: Any, rewards: Tensor, advantages: Tensor
    ) -> dict[str, float]:
        """Reassemble per-row stats in batch order and reduce them to floats."""
        b = flat.token_ids.shape[0]
        policy = torch.zeros(b, dtype=torch.long)
        ratio_sum = 0.0
        ratio_max = -math.inf
        loss = 0.0
        per_row: dict[str, Tensor] = {}
        clip_tokens = 0.0
        for c in chunks:
            st, rows = c["stats"], c["rows"]
            loss += float(c["loss"])
            n = st["policy_tokens"].cpu()
            policy[rows] = n
            ratio_sum += float(st["ratio_mean"]) * int(n.sum())
            ratio_max = max(ratio_max, float(st["ratio_max"]))
            if "clip_fraction" in st:
                clip_tokens += float(st["clip_fraction"]) * int(n.sum())
            for key in ("sequence_kl", "admitted", "retained_tokens"):
                if key in st:
                    if key not in per_row:
                        per_row[key] = torch.zeros(b, dtype=st[key].dtype)
                    per_row[key][rows] = st[key].cpu()
        total = int(policy.sum())
        adv = advantages.detach().cpu().to(torch.float64)
        r = rewards.detach().cpu().to(torch.float64)
        stats: dict[str, float] = {
            "loss": loss,
            "rows": float(b),
            "micro_batches": float(len(chunks)),
            "forward_tokens": float(sum(c["forward_tokens"] for c in chunks)),
            "policy_tokens": float(total),
            "reward_mean": float(r.mean()),
            "adv_mean": float(adv.mean()),
            "adv_std": float(adv.std(unbiased=False)),
            "adv_min": float(adv.min()),
            "adv_max": float(adv.max()),
            "ratio_mean": ratio_sum / total,
            "ratio_max": ratio_max,
        }
        kl = per_row["sequence_kl"].to(torch.float64)
        stats.update(seq_kl_mean=float(kl.mean()), seq_kl_max=float(kl.max()))
        if self.algo == "flashreinforce":
            retained = int(per_row["retained_tokens"].sum())
            admitted = per_row["admitted"].to(torch.float64)
            pos, neg = adv > 0, adv < 0
            stats.update(
                acceptance_rate=float(admitted.mean()),
                # which side the gate drops: rows that the step pushes up (better than the baseline)
                # and rows that it pushes down; nan when the batch has no such row
                acceptance_positive=float(admitted[pos].mean()) if bool(pos.any()) else math.nan,
                acceptance_negative=float(admitted[neg].mean()) if bool(neg.any()) else math.nan,
                retained_tokens=float(retained),
                retained_fraction=retained / total,
            )
        else:  # GRPO has no gate and no filter: every row and token counts
            stats.update(
                acceptance_rate=1.0,
                retained_tokens=float(total),
                retained_fraction=1.0,
                clip_fraction=clip_tokens / total,
            )
        versions = getattr(flat, "versions", None)
        if isinstance(versions, Tensor) and versions.shape == flat.action_mask.shape:
            v = versions[flat.action_mask]
            if v.numel() and bool((v >= 0).all()):
                lag = self.version - v.to(torch.float64)
                stats["staleness_mean"] = float(lag.mean())
                stats["staleness_max"] = float(lag.max())
        return stats
