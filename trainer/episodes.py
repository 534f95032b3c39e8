"""Scheduled episodes -> engine -> env -> trajectory tree, for the training loop.

:class:`EpisodeRunner` owns the rollout engine (its own copy of the model, fed weights by the
learner) and turns one :class:`~trainer.batches.EpisodeSpec` into the finished leaves of its tree
with :func:`fr_agents.rollout.run_episode` (chat template, token truth, per-token versions; the
prompt is the tree root, so identical prompts share it and GRPO groups pack together). With
``rollout.branch_factor`` K > 1 the episode forks into K branches at each turn of
``rollout.branch_at``, so it ends with up to ``K ** len(branch_at)`` leaves, listed depth first. Every
request of an episode is seeded from the spec (:class:`fr_agents.policy.seeded.SeededEngine`), so a
re-run after a crash reproduces the tokens. It also provides the encodings evaluation and the warm
start need, built the same way the rollout builds prompts.

Infrastructure failures (docs/DESIGN.md, "Infrastructure failures"). A leaf whose grading could not
happen ends ``aborted`` (:class:`fr_agents.errors.InfrastructureFailure`, caught by the rollout; a
failed ``reset`` aborts the attempt before anything is sampled). While an attempt keeps no leaf,
the episode is run again with a fresh env, the same task and the *same seed*, up to
``rollout.max_infra_retries`` times: the retry samples exactly what the failed attempt sampled (same
weights, same per-request seeds), so a failure that goes away leaves the batch as it would have been
without it, and a resumed run trains on the same data. The outcome lists the kept leaves and every
aborted one; an episode whose every attempt aborted keeps no leaf and adds nothing to its batch.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fr_agents.config import ConfigError, TrainConfig
from fr_agents.errors import InfrastructureFailure
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.seeded import SeededEngine
from fr_agents.rollout import reset_args
from trainer.batches import EpisodeSpec, derive_seed

if TYPE_CHECKING:
    from fr_agents.policy.base import Engine
    from fr_agents.tree import TrajectoryTree
    from trainer.types import EnvFactory, PolicyModel, Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LeafOutcome:
    """One finished leaf of an episode."""

    leaf_id: int
    reward: float
    policy_tokens: int
    turns: int
    status: str = "finished"
    partial_score: float | None = None
    sampled_tokens: int | None = None  # policy tokens the engine sampled for this branch itself (LeafResult)
    attempt: int = 0  # which run of the episode grew it (0: the first; retries after infrastructure failures)
    reason: str | None = None  # status aborted: what failed (InfrastructureFailure.reason)


def aborted_attempt(attempt: int, failure: BaseException) -> LeafOutcome:
    """An attempt that failed before it sampled anything (its env's ``reset``): no leaf (id -1)."""
    return LeafOutcome(
        -1, 0.0, 0, 0, "aborted", None, 0, attempt, getattr(failure, "reason", type(failure).__name__)
    )


@dataclass
class EpisodeOutcome:
    """A finished episode: its leaves in depth-first order (one when it did not branch).

    ``leaf_id``/``policy_tokens``/``turns`` describe the first leaf (the linear case); ``reward``
    is the mean over the leaves. ``aborted``: the leaves of its attempts whose grading could not
    happen (never trained on; a leaf id of -1 when an attempt failed before sampling); ``attempts``:
    how many times it was run. ``leaves`` is empty when every attempt aborted."""

    leaves: list[LeafOutcome]
    aborted: list[LeafOutcome] = field(default_factory=list)
    attempts: int = 1

    @property
    def leaf_id(self) -> int:
        return self.leaves[0].leaf_id if self.leaves else -1

    @property
    def reward(self) -> float:
        return sum(x.reward for x in self.leaves) / len(self.leaves) if self.leaves else float("nan")

    @property
    def policy_tokens(self) -> int:
        return self.leaves[0].policy_tokens if self.leaves else 0

    @property
    def turns(self) -> int:
        return self.leaves[0].turns if self.leaves else 0


def make_engine(
    cfg: TrainConfig, model_dir: Path | str, tokenizer: Tokenizer, *, model: PolicyModel | None = None
) -> Engine:
    """The rollout engine ``rollout.engine`` names, holding its own copy of the policy.

    * ``hf``: :class:`~fr_agents.policy.hf.HFEngine` on a copy of ``model`` (or a fresh load of
      ``model_dir``) in ``rollout.dtype`` (else ``model.dtype``) on ``trainer.device``;
    * ``vllm``: :class:`~fr_agents.policy.vllm_engine.VLLMEngine` loading ``model_dir``, with
      ``max_model_len = rollout.max_context`` and ``max_num_seqs = rollout.concurrency``; weights
      are reloaded in place after each step (:meth:`VLLMEngine.set_weights`).
    """
    r = cfg.rollout
    if r.engine == "vllm":
        import os

        from fr_agents.policy.vllm_engine import VLLMEngine

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default is far larger
        kwargs: dict[str, Any] = {"max_model_len": r.max_context, "max_num_seqs": max(1, r.concurrency)}
        if cfg.trainer.device.startswith("cuda"):
            kwargs["gpu_memory_utilization"] = 0.5  # the learner shares the device
        engine = VLLMEngine(str(model_dir), dtype=cfg.engine_dtype, seed=cfg.trainer.seed, **kwargs)
        try:  # one token now: a model vLLM cannot serve fails here, before any warm start or rollout
            engine.generate_sync([int(tokenizer.eos_token_id or 0)], SamplingOptions(max_tokens=1))
        except Exception as e:
            engine.close_sync()
            raise ConfigError(
                f"rollout.engine=vllm: vLLM cannot serve {model_dir} ({type(e).__name__}: {e})"
            ) from e
        return engine
    if r.engine != "hf":
        raise ValueError(f"rollout.engine: unknown engine {r.engine!r}")
    from transformers import AutoModelForCausalLM

    from fr_agents.policy.hf import HFEngine

    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, cfg.engine_dtype))
        model.to(cfg.trainer.device)
    else:
        model = copy.deepcopy(model).to(getattr(torch, cfg.engine_dtype))
    engine = HFEngine(
        model,
        tokenizer,
        max_batch_size=max(1, r.concurrency),
        seed=cfg.trainer.seed,
        compact=cfg.model.compact_forward,
    )
    if engine.compact_reason is None:
        log.info(
            "rollout engine: %s, running batches through the compact forward (fr_agents.models.compact)",
            cfg.engine_dtype,
        )
    else:
        log.info("rollout engine: transformers' forward (no compact forward: %s)", engine.compact_reason)
    return engine


class EpisodeRunner:
    """Runs scheduled episodes for the loop (see the module docstring).

    ``engine``: the engine to sample with, built by the caller (the elastic runtime's pool);
    else :func:`make_engine` builds the one ``rollout.engine`` names.
    ``model``: for the hf engine, a model whose copy the engine samples with (else it loads one).
    ``with_engine=False``: no engine at all (a Ray learner encodes prompts and demos but never
    samples: its rollout workers hold the engines).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model_dir: Path | str,
        tokenizer: Tokenizer,
        tree: TrajectoryTree,
        make_env: EnvFactory,
        tasks: list[dict[str, Any]],  # Task dicts (envs.tasks.base.Task)
        *,
        engine: Engine | None = None,
        model: PolicyModel | None = None,
        with_engine: bool = True,
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.tree = tree
        self.make_env = make_env
        self.tasks = tasks
        if engine is None and with_engine:
            engine = make_engine(cfg, model_dir, tokenizer, model=model)
        self.engine = engine
        from fr_agents.rollout import RolloutOptions, default_stop_ids, example_turns

        r = cfg.rollout
        self.stop_ids: list[int] = list(default_stop_ids(tokenizer))
        eos = tokenizer.eos_token_id
        # the end-of-turn token a perfect reply ends with (warm-start demos)
        self.end_of_turn = int(eos) if eos is not None else self.stop_ids[0]
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_of_turn)
        self.options = RolloutOptions(
            temperature=r.temperature,
            max_new_tokens=r.max_new_tokens,
            max_context=r.max_context,
            max_turns=max(1, cfg.env.max_turns),
            system_prompt=cfg.env.system_prompt,
            examples=example_turns(cfg.env.examples),
            turn_reward=r.turn_reward,
            branch_factor=r.branch_factor,
            branch_at=tuple(int(t) for t in r.branch_at),
            tree_budget_tokens=r.tree_budget_tokens,
            branch_policy=r.branch_policy,
            branch_entropy=r.branch_entropy,
            top_p=r.top_p,
            top_k=r.top_k,
            importance_correction=cfg.objective.importance_sampling,
        )

    # ------------------------------------------------------------------ encoding

    def encode_observation(self, obs: str) -> list[int]:
        """The prompt tokens for a first observation, exactly as an episode encodes them
        (:func:`fr_agents.rollout.encode_prompt`: chat template, round-trip check)."""
        from fr_agents.rollout import encode_prompt

        return encode_prompt(self.tokenizer, obs, self.cfg.env.system_prompt, self.options.examples)[1]

    def encode_task(self, task: dict[str, Any]) -> list[int]:
        env = self.make_env()
        try:
            obs, _ = env.reset(options={"task": dict(task)})
        finally:
            env.close()
        return self.encode_observation(obs)

    def encode_answer(self, task: dict[str, Any]) -> list[int]:
        """A perfect reply's tokens (the gold answer, then the end-of-turn token) for warm starts."""
        return list(self.tokenizer.encode(str(task["answer"]), add_special_tokens=False)) + [self.end_of_turn]

    # ------------------------------------------------------------------ weights

    def set_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.engine.set_weights(state_dict, version)

    # ------------------------------------------------------------------ one episode

    async def run(self, spec: EpisodeSpec) -> EpisodeOutcome:
        """Run one scheduled episode with :func:`fr_agents.rollout.run_episode`; its leaves.

        An attempt that keeps no leaf (all aborted: the grader or the sandbox failed) is run again,
        same seed, at most ``rollout.max_infra_retries`` times (see the module docstring)."""
        aborted: list[LeafOutcome] = []
        attempts = 1 + self.cfg.rollout.max_infra_retries
        for attempt in range(attempts):
            try:
                leaves = await self._attempt(spec, attempt)
            except InfrastructureFailure as e:  # its reset failed: nothing was sampled
                leaves = [aborted_attempt(attempt, e)]
            kept = [x for x in leaves if x.status != "aborted"]
            aborted.extend(x for x in leaves if x.status == "aborted")
            if kept:
                return EpisodeOutcome(kept, aborted, attempt + 1)
            last = attempt + 1 == attempts
            log.warning(
                "episode %d: attempt %d of %d aborted (%s): %s",
                spec.episode,
                attempt + 1,
                attempts,
                ", ".join(sorted({str(x.reason) for x in leaves})),
                f"no retry left, it adds nothing to batch {spec.batch}" if last else "running it again",
            )
        return EpisodeOutcome([], aborted, attempts)

    async def _attempt(self, spec: EpisodeSpec, attempt: int) -> list[LeafOutcome]:
        """One run of ``spec``: a fresh env and a fresh seeded engine view, so every attempt
        requests exactly the seeds the first did."""
        from fr_agents.rollout import run_episode

        task = self.tasks[spec.task_index]
        reset_seed, task_option = reset_args(task, spec.seed % (2**31))
        result = await run_episode(
            None,  # made by make_env in the env thread that resets it
            SeededEngine(self.engine, lambda n, seed=spec.seed: derive_seed("sample", seed, n) % (2**63)),
            self.tokenizer,
            self.tree,
            self.options,
            seed=reset_seed,
            task=task_option,
            make_env=self.make_env,
        )
        return [
            LeafOutcome(
                x.leaf_id,
                x.reward,
                x.policy_tokens,
                x.turns,
                x.status,
                x.partial_score,
                x.sampled_tokens,
                attempt,
                x.info.get("aborted_by"),
            )
            for x in result.leaves
        ]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close_sync()
