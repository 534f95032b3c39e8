"""The rollout side of a run, built on its own: what a rollout process needs and nothing more.

A run has two sides (data flows env -> rollout -> tree -> learner -> weights back)::

    rollout side (this module)                     learner side (trainer.loop.Trainer)
    ──────────────────────────                     ──────────────────────────────────
    tokenizer, task splits, env factory,           the policy model, the Learner (optimizer),
    trajectory tree, episode ledger, schedule,     weight board, metrics, evaluations,
    EpisodeRunner (its engine: ONE policy copy)    warm start, checkpoints

The embedded loop builds both sides in one process. A Ray rollout worker builds only this one:
one policy copy inside its engine, no optimizer, no learner model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fr_agents.config import TrainConfig

STORE_FILE = "store.sqlite"
LEDGER_FILE = "episodes.sqlite"


def model_dir(cfg: TrainConfig) -> Path | str:
    """The local directory (or hub id) of ``model.name``; the tiny model is built in code on first use."""
    from fr_agents.models import resolve_model, tiny_dir

    name = cfg.model.name
    if name == "tiny":
        return tiny_dir(cfg.model.tiny_size, cfg.model.tiny_seed)
    if name.startswith("tiny-"):
        return tiny_dir(name.removeprefix("tiny-"), cfg.model.tiny_seed)
    return resolve_model(name)


def load_tokenizer(where: Path | str) -> Any:
    """The policy's tokenizer (pad token defaulted to EOS, as :func:`fr_agents.models.load_policy` does)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(where)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def env_factory(cfg: TrainConfig) -> Any:
    """``() -> env`` for ``env.id`` with ``env.kwargs``."""
    import gymnasium

    env_id, kwargs = cfg.env.id, dict(cfg.env.kwargs)
    return lambda: gymnasium.make(env_id, **kwargs)


def demo_and_rl_tasks(cfg: TrainConfig, train_tasks: Any) -> tuple[list[Any], list[Any]]:
    """The warm-start demos are the first ``warm_start.examples`` train tasks; RL prompts are the
    rest, so RL never sees a label and the pool stays unlabelled from its point of view."""
    n = cfg.warm_start.examples
    demos = list(train_tasks[:n]) if n else []
    rl = list(train_tasks[n:]) if n < len(train_tasks) else list(train_tasks)
    return demos, rl


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
    cfg: TrainConfig, run_dir: str | Path, *, tokenizer: Any = None, engine_model: Any = None, with_engine: bool = True
) -> RolloutSide:
    """Build the rollout side of ``cfg`` in ``run_dir``.

    ``tokenizer``: reuse one already loaded (the embedded loop's); else it is loaded.
    ``engine_model``: for ``rollout.engine=hf``, a model whose *copy* the engine samples with
    (saves a load from disk); else the engine loads its own copy.
    ``with_engine=False``: the runner gets no engine (a Ray learner: its workers sample).
    """
    from fr_agents.plugins import load_object
    from fr_agents.tree import TrajectoryTree
    from trainer.episodes import EpisodeRunner
    from trainer.ledger import EpisodeLedger
    from trainer.schedule import EpisodeSchedule

    run_dir = Path(run_dir)
    where = model_dir(cfg)
    tok = tokenizer if tokenizer is not None else load_tokenizer(where)
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
        max_policy_lag=cfg.rollout.max_policy_lag,
        seed=cfg.trainer.seed,
        task_seed=cfg.tasks.seed,
    )
    tree = TrajectoryTree.open(run_dir / STORE_FILE)
    ledger = EpisodeLedger(run_dir / LEDGER_FILE)
    make_env = env_factory(cfg)
    runner = EpisodeRunner(cfg, where, tok, tree, make_env, rl, model=engine_model, with_engine=with_engine)
    return RolloutSide(where, tok, make_env, train_tasks, test_tasks, demos, rl, tree, ledger, schedule, runner)
