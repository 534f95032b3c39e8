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
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fr_agents.config import TrainConfig, leaves_per_tree
from fr_agents.run_layout import LEDGER_FILE, STORE_FILE
from trainer.affinity import cores_given, split


def warm_start_threads() -> int:
    """Torch threads of the warm start: the cores this process is given (:func:`cores_given`), or
    ``OMP_NUM_THREADS`` when the user set it (the thread count decides nothing but speed: the warm
    start's recipe is chosen to land at the same held-out score on any thread count)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return cores_given()


@contextlib.contextmanager
def warm_start_cores() -> Iterator[None]:
    """Run a block (the warm start: supervised steps with nothing beside them in the process) on
    :func:`warm_start_threads` torch threads, then restore the count (``trainer.threads`` sizes the
    learner for RL, where the rollout side shares the cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(warm_start_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def learner_threads(cfg: TrainConfig) -> int:
    """Torch threads of the learner and its held-out evaluations: ``trainer.threads``, or half the
    cores this process is given."""
    return cfg.trainer.threads or max(1, cores_given() // 2)


def rollout_threads(cfg: TrainConfig) -> int:
    """Torch threads of a rollout process (``trainer.backend=process``): the cores the learner
    leaves, at least one; with ``trainer.pin_cpus``, one per CPU the process is pinned to."""
    cpus = cpu_split(cfg)
    if cpus is not None:
        return len(cpus[1])
    return max(1, cores_given() - learner_threads(cfg))


def cpu_split(cfg: TrainConfig) -> tuple[list[int], list[int]] | None:
    """``trainer.pin_cpus``: the learner's CPUs (``learner_threads`` of them) and the rollout
    process's (the rest), or ``None`` when nothing is pinned (see :func:`why_not_pinned`)."""
    if not cfg.trainer.pin_cpus or cfg.trainer.backend != "process":
        return None
    return split(learner_threads(cfg))


def why_not_pinned(cfg: TrainConfig) -> str | None:
    """Why ``trainer.pin_cpus`` pins nothing in this run (``None``: it pins, or it is off)."""
    if not cfg.trainer.pin_cpus or cpu_split(cfg) is not None:
        return None
    if cfg.trainer.backend != "process":
        return (f"trainer.backend={cfg.trainer.backend} has no rollout process of its own to pin apart "
                "(pinning acts with trainer.backend=process)")
    return f"no CPU is left for the rollout beside the learner's {learner_threads(cfg)}"


def apply_memory_option(cfg: TrainConfig) -> None:
    """``trainer.keep_freed_memory`` for this process (each side's builder calls it, in whichever
    process that side runs): see :mod:`trainer.memory`."""
    if not cfg.trainer.keep_freed_memory:
        return
    from trainer.memory import keep_freed_memory

    if why := keep_freed_memory():
        logging.getLogger(__name__).warning("trainer.keep_freed_memory: nothing changed: %s", why)


def quiet_gc(cfg: TrainConfig) -> contextlib.AbstractContextManager[None]:
    """``trainer.freeze_gc``: the garbage-collector setting of :func:`trainer.memory.frozen_gc`
    for a block of RL (nothing when off)."""
    if not cfg.trainer.freeze_gc:
        return contextlib.nullcontext()
    from trainer.memory import frozen_gc

    return frozen_gc()


def model_dir(cfg: TrainConfig) -> Path | str:
    """The local directory (or hub id) of ``model.name``; the tiny model is built in code on first use."""
    from fr_agents.models import resolve_model, tiny_dir

    name = cfg.model.name
    if name == "tiny":
        return tiny_dir(cfg.model.tiny_size, cfg.model.tiny_seed)
    if name.startswith("tiny-"):
        return tiny_dir(name.removeprefix("tiny-"), cfg.model.tiny_seed)
    return resolve_model(name)


def env_factory(cfg: TrainConfig) -> Any:
    """``() -> env`` for ``env.id`` with ``env.kwargs``."""
    import gymnasium

    env_id, kwargs = cfg.env.id, dict(cfg.env.kwargs)
    return lambda: gymnasium.make(env_id, **kwargs)


def demo_and_rl_tasks(cfg: TrainConfig, train_tasks: Any) -> tuple[list[Any], list[Any]]:
    """The warm-start demos are ``warm_start.examples`` train tasks; RL prompts come from the others,
    in train order, so RL never sees a label and the pool stays unlabelled from its point of view.

    ``warm_start.balance`` picks the demos: ``natural`` the first ones, ``answer_length`` an equal
    share of each gold-answer length (:func:`stratified_indices`). ``tasks.balance`` picks the RL
    prompts among the rest: ``natural`` all of them, ``answer_length`` as many of each length as the
    rarest has (:func:`balanced_indices`).
    """
    n = min(cfg.warm_start.examples, len(train_tasks))
    by_length = "answer_length" in (cfg.warm_start.balance, cfg.tasks.balance)
    keys = [len(t["answer"]) for t in train_tasks] if by_length else []
    picked = stratified_indices(keys, n) if cfg.warm_start.balance == "answer_length" else list(range(n))
    chosen = set(picked)
    rest = [i for i in range(len(train_tasks)) if i not in chosen]
    if cfg.tasks.balance == "answer_length":
        rest = balanced_indices(keys, rest)
    if by_length:
        logging.getLogger(__name__).info(
            "answer lengths (length: tasks): demos %s (warm_start.balance=%s), RL prompts %s (tasks.balance=%s)",
            dict(sorted(Counter(keys[i] for i in picked).items())), cfg.warm_start.balance,
            dict(sorted(Counter(keys[i] for i in rest).items())), cfg.tasks.balance)
    demos = [train_tasks[i] for i in picked]
    rl = [train_tasks[i] for i in rest] or list(train_tasks)
    return demos, rl


def stratified_indices(keys: list[Any], n: int) -> list[int]:
    """``n`` indices into ``keys``, as many for each distinct key as for any other, each key's taken
    in order; a key with too few items gives all it has and the first items not yet taken fill the
    rest. The result is sorted (train order), so it is deterministic for a given split.

    >>> stratified_indices([8, 8, 8, 7, 8, 7], 4)
    [0, 1, 3, 5]
    """
    by_key = _by_key(keys, range(len(keys)))
    picked: set[int] = set()
    left = min(n, len(keys))
    groups = sorted(by_key.values(), key=len)  # the smallest first, so what they lack goes to the others
    for g_i, idx in enumerate(groups):
        share = left // (len(groups) - g_i)
        take = idx[:share]
        picked.update(take)
        left -= len(take)
    for i in range(len(keys)):
        if left <= 0:
            break
        if i not in picked:
            picked.add(i)
            left -= 1
    return sorted(picked)


def balanced_indices(keys: list[Any], among: list[int]) -> list[int]:
    """The indices of ``among`` kept so that every key has as many as the rarest key has: each key's
    first ones, in order; the result is sorted.

    >>> balanced_indices([8, 8, 7, 8, 7, 8], [0, 1, 2, 3, 4, 5])
    [0, 1, 2, 4]
    """
    by_key = _by_key(keys, among)
    if not by_key:
        return []
    m = min(len(v) for v in by_key.values())
    return sorted(i for idx in by_key.values() for i in idx[:m])


def _by_key(keys: list[Any], among: Any) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for i in among:
        out.setdefault(keys[i], []).append(i)
    return out


@dataclass
class RolloutSide:
    """The parts a rollout process runs episodes with (see the module docstring)."""

    model_dir: Path | str
    tokenizer: Any
    make_env: Any
    train_tasks: Any
    test_tasks: Any
    demo_tasks: list[Any]
    rl_tasks: list[Any]
    tree: Any
    ledger: Any
    schedule: Any
    runner: Any

    def close(self) -> None:
        self.runner.close()
        self.ledger.close()
        self.tree.close()


def build_rollout_side(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    tokenizer: Any = None,
    engine_model: Any = None,
    with_engine: bool = True,
    engine: Callable[[Any, Any], Any] | None = None,
) -> RolloutSide:
    """Build the rollout side of ``cfg`` in ``run_dir``.

    ``tokenizer``: reuse one already loaded (the embedded loop's); else it is loaded.
    ``engine_model``: for ``rollout.engine=hf``, a model whose *copy* the engine samples with
    (saves a load from disk); else the engine loads its own copy.
    ``with_engine=False``: the runner gets no engine (a Ray learner: its workers sample).
    ``engine``: ``(base engine, tokenizer) -> engine`` the runner samples with instead (a hook:
    :meth:`trainer.hooks.TrainerHooks.engine`, e.g. the elastic runtime's pool of slot engines).
    """
    from fr_agents.models import load_tokenizer
    from fr_agents.plugins import load_object
    from fr_agents.tree import TrajectoryTree
    from trainer.episodes import EpisodeRunner, make_engine
    from trainer.ledger import EpisodeLedger
    from trainer.schedule import EpisodeSchedule

    apply_memory_option(cfg)
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
    runner = EpisodeRunner(cfg, where, tok, tree, make_env, rl, engine=chosen, model=engine_model, with_engine=with_engine)
    return RolloutSide(where, tok, make_env, train_tasks, test_tasks, demos, rl, tree, ledger, schedule, runner)


@dataclass
class LearnerSide:
    """The parts that learn: one policy model and everything that changes it or reports on it."""

    model_dir: Path | str
    model: Any
    tokenizer: Any
    learner: Any
    board: Any
    metrics: Any
    held_out: Any  # HeldOutEval or None (trainer.eval_episodes == 0)
    periodic: Any  # PeriodicEval or None


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

    apply_memory_option(cfg)
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
    metrics = MetricsSink(run_dir, plot_every=cfg.trainer.plot_every, log_every=cfg.trainer.log_every, console=console)
    return LearnerSide(where, model, tokenizer, learner, WeightBoard(), metrics, held_out, periodic)
