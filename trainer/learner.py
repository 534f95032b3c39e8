"""The learner: exactly one optimizer step per fresh batch of complete trajectories.

``Learner.step(batch)`` takes a :class:`~fr_agents.tree.batch.FlatBatch` (one ``[B, T]`` row per
trajectory) or a :class:`~fr_agents.tree.batch.PackedBatch` (every shared prefix token laid out once,
plus the index map back to rows) and

1. computes the advantages once on the full batch (:func:`trainer.objective.batch_advantages`:
   centred rewards, the tree baseline, or GRPO group-normalised);
2. cuts the batch into chunks by a token budget (:class:`~trainer.learner.Chunking`): row
   micro-batches of a flat batch, or groups of roots of a packed one (each root's packed subtree one
   row of a padded ``[R, W]`` forward, so memory grows with the sum over roots, not with the square
   of the batch); a packed batch whose largest root does not fit the budget is micro-batched in its
   flat view;
3. per chunk, recomputes the current log-probs at the *sampling temperature* through
   :class:`~fr_agents.models.forward.PolicyForward` (every way of running the model lives there),
   runs the loss its :class:`~fr_agents.objective_config.ObjectiveConfig` names
   (:func:`trainer.objective.objective_loss`) with the full batch's advantages and denominators,
   and accumulates the gradients, so the step does not depend on the chunking;
4. refuses a non-finite loss or gradient (:class:`NonFiniteLossError`) *before* stepping;
5. clips the gradient norm, takes one optimizer step, marks the batch consumed (a second use raises)
   and returns the step's statistics (:func:`merge_stats`).

Its switches live in four small configs, each declared once: the objective's
(:class:`~fr_agents.objective_config.ObjectiveConfig`), the optimizer's
(:class:`~fr_agents.config.OptimConfig`), the chunking (:class:`~trainer.learner.Chunking`) and the forward
(:class:`~fr_agents.models.forward.ForwardConfig`). ``Learner.from_config(model, cfg)`` fills them
from the run's config, and each is checked once, when the learner is built; read a switch where
it lives (``learner.objective.delta``, ``learner.chunking.packed``, ``learner.policy.config``).

How a learner step cuts its batch into forwards: one token budget, two batch forms.

A flat batch is cut into row micro-batches whose ``rows x padded length`` fits
``micro_batch_tokens`` (longest rows first, so a chunk's rows are of similar length and little
padding is run). A tree-packed batch is cut into groups of roots
(:meth:`~fr_agents.tree.batch.PackedBatch.root_chunks`, the same budget over ``roots x widest
root``), each one padded per-root forward; when its largest root alone is over the budget, its flat
view is micro-batched instead. The objective's denominators are the full batch's, so the step's
loss and gradient do not depend on the cut.

Spike clipping: bound a step's gradient norm by a multiple of the recent median.

Why. Adam's second moment (``beta2 = 0.999``) remembers ~1,000 steps of gradient scale, so a
batch whose gradient is far larger than the recent ones is not normalised away: the update grows
with it, and the first moment (``beta1 = 0.9``) keeps pushing the same way for ~10 more steps.
The fixed clip (``optim.grad_clip``, 1.0) is set for the start of training and is far above the
norms a converging RL run produces, so it does not see such a step.

Measured on python-tool-tiny (``configs/python-tool-tiny.yaml``), from checkpoints of two
runs that collapsed, recomputing the stored batch of the collapsing step with the real AdamW state
and measuring the tempered KL(old || new) on the sampled tokens of that batch and the next:

* a step with gradient norm 1.82 against a median of ~0.1 over the 50 before it (one failed row,
  one digit sampled at p ~0.003): KL 0.014 after the step and 0.185 after five more steps on the
  same momentum, against 0.00006 and 0.0012 for an ordinary step of the same run. Clipped to 2x
  the median: 0.00024 and 0.016; to 1x: 0.00004 and 0.002;
* a run converged to batch reward ~0.95, where most batches are all-correct (gradient 0) and the
  others ~0.002: a step of 0.16 moved every parameter by about ``lr`` (0.0033 after five more
  steps); clipped to 10x the median of the non-zero norms: 0.00007.

Per-coordinate clipping against Adam's own second moment (3 or 10 sigma) did not help the first
case (0.114 and 0.184): the spike is a coherent direction, not a few outlying coordinates, so the
bound is on the global norm.

How tight. Spikes also grow Adam's second moment, which shrinks the steps after them; a bound near
the median removes that, so the steps stay large. On python-tool-tiny a bound of 1.5x the median
clipped 112 of 478 steps and the run went through a rough stretch (batch reward 0.41 over 20
steps, acceptance ~0.65) before it ended at 100% held out; 10x cut 11-32 steps of 442-514 (with
``objective.negative_min_prob`` 0.01 for the single-token spikes) and ran smoothly. The preset uses 10.
It does not stop a drift made of several moderate steps while the policy still learns (gradient norms
2-5x the median, where 10x the median is no tighter than ``optim.grad_clip``): one of three seeds of
``benchmarks/learning.py`` on python-tool-tiny (collapse guard off) went that way (docs/DESIGN.md).

How. The bound is ``k x median`` of the last ``window`` pre-clip gradient norms that were not 0
(a batch whose advantages are all 0 carries no scale). Until ``MIN_HISTORY`` norms are known it
does not bound anything. A clipped step records its pre-clip norm too: the median, unlike a mean,
is not pulled up by the spikes it clips, and a lasting rise in scale (more than half the window)
moves it. The history is part of the learner's state, saved in checkpoints, so that a resumed run
clips exactly as an uninterrupted one. A step's ``spike_clipped`` metric (metrics.jsonl) is 1 when this
bound, below ``optim.grad_clip``, cut it.

The statistics of one learner step, reduced from its micro-batches.

Each micro-batch's loss returns per-row tensors (sequence KL, admitted, retained tokens) and a few
means; :func:`merge_stats` puts the rows back in batch order and reduces them to the floats of the
step's metrics row (docs/DESIGN.md "Metrics"), so the figures do not depend on how the step was cut.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fr_agents.config import PACKED_MODES, OptimConfig, TrainConfig
from fr_agents.models.forward import FlatChunk, ForwardConfig, PackedChunk, PolicyForward
from fr_agents.objective_config import ObjectiveConfig
from fr_agents.tree.batch import FlatBatch, PackedBatch, TrainBatch
from trainer.objective import LossInputs, batch_advantages, denominators, objective_loss, validate_weights

if TYPE_CHECKING:
    from fr_agents.tree.batch import FlatBatch


logger = logging.getLogger(__name__)

Tensor = torch.Tensor


class NonFiniteLossError(FloatingPointError):
    """The loss or the gradient norm of a step is NaN/inf. Raised before the optimizer steps.

    The gradients are zeroed and the batch is *not* consumed, so the training loop can save the
    batch (``.batch``) for inspection and stop. ``.stats`` holds what was computed so far.
    """

    def __init__(self, message: str, batch: TrainBatch | None = None, stats: dict[str, float] | None = None):
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


def _fusable(params: list[Tensor]) -> bool:
    """Whether AdamW can take its fused kernel: one update per parameter instead of ~10 elementwise
    ops (3x less optimizer time for a small model on CPU; the same update up to float rounding)."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


class Learner:
    """One optimizer step per fresh batch (see the module docstring).

    Args:
        model: a causal LM returning ``.logits`` (a transformers model).
        optimizer: defaults to ``AdamW(optim.lr, optim.betas, optim.weight_decay)``.
        objective: the loss and its switches (:class:`~fr_agents.objective_config.ObjectiveConfig`).
        optim: learning rate, betas and weight decay of the default optimizer; ``grad_clip`` (max
            gradient norm, <= 0: off, the norm is still reported); ``spike_clip`` > 0 also clips
            to that multiple of the median of the last ``spike_window`` non-zero norms
            (:mod:`trainer.learner`). The warm-up and schedule are :func:`make_scheduler`'s.
        chunking: the token budget of one forward and the packed path (:class:`~trainer.learner.Chunking`).
        forward: temperature, compact forward, tree attention and autocast
            (:class:`~fr_agents.models.forward.ForwardConfig`).
        scheduler: an LR scheduler stepped after every optimizer step.
        version: the policy version of the current weights; +1 per step.
        before_micro_batch: a hook called before every chunk of a step (the elastic runtime hands
            a step the train slots that joined while it ran); None: nothing.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        objective: ObjectiveConfig | None = None,
        optim: OptimConfig | None = None,
        chunking: Chunking | None = None,
        forward: ForwardConfig | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        version: int = 0,
        before_micro_batch: Callable[[], None] | None = None,
    ) -> None:
        self.objective = ObjectiveConfig() if objective is None else objective
        self.optim = OptimConfig() if optim is None else optim
        self.chunking = Chunking() if chunking is None else chunking
        forward = ForwardConfig() if forward is None else forward
        self.objective.check()
        self.chunking.check()
        forward.check()
        self._entropies = self.objective.needs_entropies  # read once: the configs are fixed from here on
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        o = self.optim
        self.optimizer = optimizer or torch.optim.AdamW(
            self.params,
            lr=o.lr,
            betas=tuple(float(b) for b in o.betas),
            weight_decay=o.weight_decay,
            fused=_fusable(self.params),
        )
        self.scheduler = scheduler
        self.spike = SpikeClip(o.spike_clip, o.spike_window) if o.spike_clip > 0 else None
        self.policy = PolicyForward(model, forward)
        self.version = version
        self.before_micro_batch = before_micro_batch

    @classmethod
    def from_config(
        cls,
        model: torch.nn.Module,
        cfg: TrainConfig,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        before_micro_batch: Callable[[], None] | None = None,
    ) -> Learner:
        """A learner with every switch taken from ``cfg`` (objective, optim, trainer, rollout temperature)."""
        t = cfg.trainer
        learner = cls(
            model,
            optimizer,
            objective=cfg.objective,
            optim=cfg.optim,
            chunking=Chunking(micro_batch_tokens=t.micro_batch_tokens, packed=t.packed),
            forward=ForwardConfig(
                temperature=cfg.rollout.temperature,
                compact_forward=cfg.model.compact_forward,
                autocast=cfg.learner_autocast,
            ),
            before_micro_batch=before_micro_batch,
        )
        opt = cfg.optim
        if opt.scheduler != "constant" or opt.warmup_steps:
            learner.scheduler = make_scheduler(learner.optimizer, opt, t.steps)
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

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """Recompute log-probs, accumulate the loss gradient, clip, take one optimizer step.

        Raises:
            RuntimeError: the batch was already consumed by a step.
            ValueError: the batch is malformed (the message names the field).
            NonFiniteLossError: the loss or gradient is NaN/inf (nothing was stepped).
        """
        if batch.consumed:
            raise RuntimeError("batch: already consumed by a learner step (one step per fresh batch)")
        started = time.perf_counter()
        packed_input = is_packed(batch)
        flat = batch.flat if packed_input else batch
        self._validate_flat(flat)
        device = self.params[0].device if self.params else torch.device("cpu")
        action_mask = flat.action_mask.to(device)
        rewards = flat.rewards.to(device)
        weights = self._weights(flat, device)
        try:
            advantages = self._finite(
                batch_advantages(
                    self.objective,
                    rewards,
                    weights=weights,
                    branch_rows=flat.branch_rows,
                    root_ids=flat.root_ids,
                    node_spans=flat.node_spans,
                    width=int(flat.token_ids.shape[1]),
                    credit_ends=flat.credit_ends,
                )
            )
        except NonFiniteLossError as e:
            e.batch = batch
            raise
        num_rows, num_tokens = denominators(action_mask, weights)  # the full batch's, for every chunk

        use_packed = packed_input and self.chunking.takes_packed(batch)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            if use_packed:
                todo: list[Any] = [
                    PackedChunk(batch, r) for r in batch.root_chunks(self.chunking.micro_batch_tokens)
                ]
            else:
                todo = [FlatChunk(flat, rows) for rows in self.chunking.micro_batches(flat.attention_mask)]
            chunks = []
            for chunk in todo:
                if self.before_micro_batch is not None:
                    self.before_micro_batch()
                chunks.append(self._run_chunk(chunk, flat, advantages, weights, num_rows, num_tokens, device))
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
        stats = merge_stats(chunks, flat, rewards, advantages, self.objective.algo, self.version)
        stats["packed"] = float(use_packed)
        if flat.credit_ends is not None:  # rollout.reward=progress: policy tokens after their row's progress
            after = torch.arange(flat.token_ids.shape[1])[None, :] >= flat.credit_ends[:, None]
            unpaid = int((flat.action_mask & after).sum())
            stats["unpaid_tokens"] = unpaid / max(1, int(flat.action_mask.sum()))
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
        clip = self.optim.grad_clip
        fixed = clip if clip and clip > 0 else math.inf
        spike_bound = self.spike.bound() if self.spike is not None else math.inf
        stats["spike_clipped"] = float(
            grad_norm > spike_bound and spike_bound < fixed
        )  # the spike clip cut it
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
        logger.warning(
            "step %d: no leaf to train on (every episode of the batch aborted); weights unchanged",
            self.version,
        )
        return {
            "version": float(self.version),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped": 1.0,
        }

    # ----------------------------------------------------------------------- helpers

    @staticmethod
    def _validate_flat(flat: FlatBatch) -> None:
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
    def _weights(flat: FlatBatch, device: torch.device) -> Tensor | None:
        """The batch's row weights (sampled leaves per row, float64 on ``device``), or None."""
        weights = flat.weights
        if weights is None:
            return None
        # getattr: a non-tensor reaches validate_weights, which names the field
        validate_weights(weights, flat.token_ids.shape[0], getattr(weights, "device", device))
        return weights.to(device=device, dtype=torch.float64)

    @staticmethod
    def _finite(advantages: Tensor) -> Tensor:
        if not bool(torch.isfinite(advantages).all()):
            raise NonFiniteLossError("advantages: non-finite (the reward statistics overflowed)")
        return advantages

    def _check_current(self, log_probs: Tensor, action_mask: Tensor) -> None:
        """The model's own log-probs must be finite on policy tokens (else the weights diverged)."""
        if not bool(torch.isfinite(log_probs.detach()[action_mask]).all()):
            raise NonFiniteLossError(f"the model gives non-finite log-probs at version {self.version}")

    def _failures(self, flat: FlatBatch, rows: Tensor | None, device: torch.device) -> Tensor | None:
        if not self._entropies:
            return None
        failures = flat.failures
        if not isinstance(failures, Tensor) or failures.dtype != torch.bool:
            raise ValueError("failures: the entropy filter needs explicit bool failure labels [B]")
        return (failures if rows is None else failures[rows]).to(device)

    def _run_chunk(
        self,
        chunk: FlatChunk | PackedChunk,
        flat: FlatBatch,
        advantages: Tensor,
        weights: Tensor | None,
        num_rows: float,
        num_tokens: float,
        device: torch.device,
    ) -> dict[str, Any]:
        """Forward + backward of one chunk: its log-probs, then the objective on its rows."""
        out = self.policy.logprobs(chunk, device, entropies=self._entropies)
        rows, on_device = out.rows, out.rows.to(device)
        self._check_current(out.log_probs, out.action_mask)
        inputs = LossInputs(
            log_probs=out.log_probs,
            behavior_log_probs=flat.behavior_logprobs[rows, : out.width].to(device),
            rewards=flat.rewards[rows].to(device),
            action_mask=out.action_mask,
            advantages=advantages[on_device] if advantages.dim() == 1 else advantages[on_device, : out.width],
            num_rows=num_rows,
            num_tokens=num_tokens,
            entropies=out.entropies,
            failures=self._failures(flat, rows, device),
            weights=None if weights is None else weights[on_device],
        )
        loss, st = objective_loss(inputs, self.objective)
        loss.backward()
        return {
            "rows": rows,
            "loss": loss.detach(),
            "stats": st,
            "forward_tokens": out.forward_tokens,
            "tree_attention": out.tree_attention,
        }


# =========================================================================== chunking


@dataclass
class Chunking:
    """How a step's batch is cut into forwards.

    Args:
        micro_batch_tokens: token budget of one forward (rows x padded length); <= 0: one chunk.
        packed: ``"auto"`` (a packed batch runs per root when its largest root fits the budget),
            ``"always"`` or ``"never"`` (its flat view is micro-batched).
    """

    micro_batch_tokens: int = 8192
    packed: str = "auto"

    def check(self) -> None:
        if self.packed not in PACKED_MODES:
            raise ValueError(f"packed: expected one of {PACKED_MODES}, got {self.packed!r}")

    def takes_packed(self, batch: PackedBatch) -> bool:
        """Whether a packed batch takes the per-root packed path: ``always``, or ``auto`` when its
        largest root fits the token budget (else its flat view is micro-batched)."""
        if self.packed == "always":
            return True
        if self.packed != "auto":
            return False
        return self.micro_batch_tokens <= 0 or batch.max_root_tokens <= self.micro_batch_tokens

    def micro_batches(self, attention_mask: Tensor) -> list[Tensor]:
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


def is_packed(batch: TrainBatch) -> bool:
    """Whether ``batch`` is tree-packed (a flat view plus the index map back to rows)."""
    return isinstance(batch, PackedBatch)


# =========================================================================== spike clip

MIN_HISTORY = 10


class SpikeClip:
    """The running bound ``k x median(recent non-zero gradient norms)``.

    Args:
        k: the multiple of the median (> 0).
        window: how many recent non-zero norms the median is taken over (>= 1).
    """

    def __init__(self, k: float, window: int = 50) -> None:
        if not (k > 0 and math.isfinite(k)):
            raise ValueError(f"optim.spike_clip: must be a finite number > 0, got {k!r}")
        if window < 1:
            raise ValueError(f"optim.spike_window: must be >= 1, got {window!r}")
        self.k = float(k)
        self.window = int(window)
        self.norms: collections.deque[float] = collections.deque(maxlen=self.window)

    def bound(self) -> float:
        """The largest gradient norm the next step may take (inf until ``MIN_HISTORY`` norms are known)."""
        if len(self.norms) < min(MIN_HISTORY, self.window):
            return math.inf
        return self.k * statistics.median(self.norms)

    def record(self, norm: float) -> None:
        """Remember a step's gradient norm before clipping (0 and non-finite norms are skipped)."""
        if norm > 0 and math.isfinite(norm):
            self.norms.append(float(norm))

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self.norms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = collections.deque((float(x) for x in state.get("norms", [])), maxlen=self.window)


# =========================================================================== step stats


def merge_stats(
    chunks: list[dict[str, Any]],
    flat: FlatBatch,
    rewards: Tensor,
    advantages: Tensor,
    algo: str,
    version: int,
) -> dict[str, float]:
    """Reassemble the chunks' per-row stats in batch order and reduce them to the step's floats.

    ``chunks``: one dict per micro-batch (``rows``, ``loss``, ``stats`` from the loss,
    ``forward_tokens``); ``algo``: the objective's (FlashREINFORCE reports its gate and filters,
    GRPO its clip fraction); ``version``: the policy version the staleness is measured against."""
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
    if adv.dim() == 2:  # per token (the nodes baseline): each row's mean over its policy tokens
        mask = flat.action_mask.to(torch.float64)
        adv = (adv * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
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
    if algo == "flashreinforce":
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
    versions = flat.versions
    if isinstance(versions, Tensor) and versions.shape == flat.action_mask.shape:
        v = versions[flat.action_mask]
        if v.numel() and bool((v >= 0).all()):
            lag = version - v.to(torch.float64)
            stats["staleness_mean"] = float(lag.mean())
            stats["staleness_max"] = float(lag.max())
    return stats
