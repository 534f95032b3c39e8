"""The two sides of a run, each from its own builder.

A run has two sides (data flows env -> rollout -> tree -> learner -> weights back)::

    rollout side (build_rollout_side)              learner side (build_learner_side)
    ─────────────────────────────────              ─────────────────────────────────
    tokenizer, task splits, env factory,           the policy model, the Learner (optimizer,
    trajectory tree, episode ledger, schedule,     scheduler), the weight board, the metrics
    EpisodeRunner (its engine: ONE policy copy)    sink, the periodic avg@k evaluator

The embedded loop (:class:`trainer.loop.Trainer`) builds both in one process and drives them;
checkpoints (:mod:`trainer.checkpoint`) save the learner side plus the store cursor. A Ray
rollout worker builds only the rollout side: one policy copy inside its engine, no optimizer, no
learner model.

This module holds the builders only: how a process sits on the machine (threads, CPU pinning,
malloc, the garbage collector) is :mod:`trainer.os_tuning`; which train tasks are warm-start demos
and which are RL prompts is :mod:`trainer.task_balance`; the run directory's file names are
:mod:`fr_agents.run_layout`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fr_agents.config import TrainConfig, leaves_per_tree
from fr_agents.run_layout import LEDGER_FILE, STORE_FILE
from trainer.os_tuning import keep_freed_memory, learner_threads, onednn_cache_capacity
from trainer.task_balance import demo_and_rl_tasks

if TYPE_CHECKING:
    from fr_agents.eval.periodic import PeriodicEval
    from fr_agents.ledger import EpisodeLedger
    from fr_agents.policy.base import Engine
    from fr_agents.tree import TrajectoryTree
    from trainer.batches import EpisodeSchedule
    from trainer.episodes import EpisodeRunner
    from trainer.evaluate import HeldOutEval
    from trainer.learner import Learner
    from trainer.metrics import MetricsSink
    from trainer.types import EnvFactory, PolicyModel, Task, Tokenizer
    from trainer.weights import WeightBoard


def model_dir(cfg: TrainConfig) -> Path | str:
    """The local directory (or hub id) of ``model.name``; the tiny model is built in code on first use."""
    from fr_agents.models import resolve_model, tiny_dir

    name = cfg.model.name
    if name == "tiny":
        return tiny_dir(cfg.model.tiny_size, cfg.model.tiny_seed)
    if name.startswith("tiny-"):
        return tiny_dir(name.removeprefix("tiny-"), cfg.model.tiny_seed)
    return resolve_model(name)


def env_factory(cfg: TrainConfig) -> EnvFactory:
    """``() -> env`` for ``env.id`` with ``env.kwargs``."""
    import gymnasium

    env_id, kwargs = cfg.env.id, dict(cfg.env.kwargs)
    return lambda: gymnasium.make(env_id, **kwargs)


@dataclass
class RolloutSide:
    """The parts a rollout process runs episodes with (see the module docstring)."""

    model_dir: Path | str
    tokenizer: Tokenizer
    make_env: EnvFactory
    train_tasks: Sequence[Task]
    test_tasks: Sequence[Task]
    demo_tasks: list[Task]
    rl_tasks: list[Task]
    tree: TrajectoryTree
    ledger: EpisodeLedger
    schedule: EpisodeSchedule
    runner: EpisodeRunner

    def close(self) -> None:
        self.runner.close()
        self.ledger.close()
        self.tree.close()


def build_rollout_side(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    engine_model: PolicyModel | None = None,
    with_engine: bool = True,
    engine: Callable[[Engine, Tokenizer], Engine] | None = None,
) -> RolloutSide:
    """Build the rollout side of ``cfg`` in ``run_dir``.

    ``tokenizer``: reuse one already loaded (the embedded loop's); else it is loaded.
    ``engine_model``: for ``rollout.engine=hf``, a model whose *copy* the engine samples with
    (saves a load from disk); else the engine loads its own copy.
    ``with_engine=False``: the runner gets no engine (a Ray learner: its workers sample).
    ``engine``: ``(base engine, tokenizer) -> engine`` the runner samples with instead (a hook:
    :meth:`trainer.loop.TrainerHooks.engine`, e.g. the elastic runtime's pool of slot engines).
    """
    from fr_agents.ledger import EpisodeLedger
    from fr_agents.models import load_tokenizer
    from fr_agents.plugins import load_object
    from fr_agents.tree import TrajectoryTree
    from trainer.batches import EpisodeSchedule
    from trainer.episodes import EpisodeRunner, make_engine

    keep_freed_memory(cfg)  # trainer.keep_freed_memory, in whichever process this side runs
    onednn_cache_capacity(cfg)  # before this side's first product
    run_dir = Path(run_dir)
    where = model_dir(cfg)
    tok = tokenizer if tokenizer is not None else load_tokenizer(str(where))
    get_task_source = load_object(cfg.tasks.provider, key="tasks.provider")
    source = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params)
    train_tasks = source.split(cfg.tasks.train_split)
    test_tasks = source.split(cfg.tasks.test_split)
    demos, rl = demo_and_rl_tasks(cfg, train_tasks)
    group = cfg.objective.grpo_group_size if cfg.objective.algo == "grpo" else 1
    schedule = EpisodeSchedule(
        num_tasks=len(rl),
        batch_size=cfg.trainer.batch_size,
        group_size=group,
        leaves_per_episode=leaves_per_tree(cfg),
        max_policy_lag=cfg.rollout.max_policy_lag,
        seed=cfg.trainer.seed,
        task_seed=cfg.tasks.seed,
    )
    tree = TrajectoryTree.open(run_dir / STORE_FILE)
    ledger = EpisodeLedger(run_dir / LEDGER_FILE)
    make_env = env_factory(cfg)
    if cfg.warm_start.examples and cfg.warm_start.demos == "expert":
        from fr_agents.rollout import require_expert

        require_expert(make_env, f"{cfg.env.id} (warm_start.demos=expert)")
    chosen = None
    if with_engine and engine is not None:
        chosen = engine(make_engine(cfg, where, tok, model=engine_model), tok)
    runner = EpisodeRunner(
        cfg, where, tok, tree, make_env, rl, engine=chosen, model=engine_model, with_engine=with_engine
    )
    return RolloutSide(
        where, tok, make_env, train_tasks, test_tasks, demos, rl, tree, ledger, schedule, runner
    )


@dataclass
class LearnerSide:
    """The parts that learn: one policy model and everything that changes it or reports on it."""

    model_dir: Path | str
    model: PolicyModel
    tokenizer: Tokenizer
    learner: Learner
    board: WeightBoard
    metrics: MetricsSink
    held_out: HeldOutEval | None  # None: trainer.eval_episodes == 0
    periodic: PeriodicEval | None  # None: no avg@k evaluations


def build_learner_side(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    console: bool = True,
    before_micro_batch: Callable[[], None] | None = None,
) -> LearnerSide:
    """Build the learner side of ``cfg`` in ``run_dir``: seeds torch and sets its thread count
    (``trainer.threads``), loads the policy on ``trainer.device``, the Learner (``before_micro_batch``:
    its hook), an empty weight board, the metrics sink, the held-out evaluator (``eval_episodes``)
    and the periodic avg@k evaluator (``eval_k``), both on one bench."""
    import logging

    import torch

    from fr_agents.models import load_policy
    from fr_agents.plugins import load_object
    from trainer.learner import Learner
    from trainer.metrics import MetricsSink
    from trainer.weights import WeightBoard

    keep_freed_memory(cfg)  # trainer.keep_freed_memory, in whichever process this side runs
    onednn_cache_capacity(cfg)  # before this side's first product
    run_dir = Path(run_dir)
    torch.set_num_threads(learner_threads(cfg))
    torch.manual_seed(cfg.trainer.seed)
    where = model_dir(cfg)
    model, tokenizer = load_policy(str(where), cfg.model.dtype, cfg.trainer.device)
    model.train()
    learner = Learner.from_config(model, cfg, before_micro_batch=before_micro_batch)
    # One held-out bench for both evaluators: greedy figures (before/after, every eval_every
    # steps) when eval_episodes > 0, and avg@k every eval_every steps when eval_k > 0.
    held_out = periodic = None
    t = cfg.trainer
    if t.eval_episodes > 0 or (t.eval_k > 0 and t.eval_every > 0):
        from fr_agents.eval.periodic import PeriodicEval
        from trainer.evaluate import HeldOutEval

        bench = load_object(t.eval_bench_provider, key="trainer.eval_bench_provider")(cfg)
        held_out = HeldOutEval.from_config(cfg, run_dir, bench)
        periodic = PeriodicEval.from_config(cfg, run_dir, bench)
    if console:  # the progress line carries the learner's per-step figures
        logging.getLogger("trainer.learner").setLevel(logging.WARNING)
    metrics = MetricsSink(
        run_dir, plot_every=cfg.trainer.plot_every, log_every=cfg.trainer.log_every, console=console
    )
    return LearnerSide(where, model, tokenizer, learner, WeightBoard(), metrics, held_out, periodic)
