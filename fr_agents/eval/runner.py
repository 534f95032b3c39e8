"""Run a checkpoint on a bench: ``k`` seeded samples per problem, one JSONL row per sample.

::

    settings = EvalSettings(k=4, temperature=1.0, seed=0)
    result = run_bench(engine, tokenizer, bench, settings, label="step_100", out_dir="evals/")
    result.metrics   # {"mean@k": 0.41, "pass@1": 0.41, "pass@2": 0.55, "pass@4": 0.66, ...}

Each sample is one episode of ``bench.env_id`` driven by :func:`fr_agents.rollout.run_episode`
(the same token-truthful rollout, chat template and env class as training), so a number here means
what the training reward means. Results are appended to
``OUT/samples/<label>/<bench>.jsonl`` as each episode ends (reward, success, turns, tool calls, the
replies, and the env's last ``info``, e.g. HumanEval's failure reason); ``extra["per_episode"]`` of
the result holds the mean turns and tool calls per episode.

Resuming. Rows already in that file are skipped: a run that was killed picks up where it stopped,
and a second run with a larger ``k`` only samples the new indices (seeds do not depend on ``k``,
see "Seeds" below). The settings that change what a sample *is* (temperature,
seed, token limits, env kwargs, system prompt) are kept in ``<bench>.meta.json`` next to the rows;
resuming with different ones is an :class:`EvalSettingsMismatch` naming the fields, never a
silent mix.

Seeds. Sample ``s`` of problem ``task_id`` on bench ``bench`` gets ``sample_seed(seed, bench, task_id,
s)``, a hash of those parts (the env is reset with :func:`item_seed`, shared by the k samples): it
does not depend on the order samples run in, on ``k`` (raising ``k`` from 4 to 8 reuses samples 0..3
as they are) or on which other problems are evaluated. Every request of the episode is then seeded
from it by :class:`fr_agents.policy.seeded.SeededEngine`, so an engine that honours
``SamplingOptions.seed`` (HFEngine does) reproduces the tokens.

Determinism. Given the seeds, each request samples with its own generator. The HF engine batches
concurrent requests; batch composition can move logits in the last float bits, which on rare
near-ties flips a token, so bit-exact reruns need ``concurrency=1``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium

from fr_agents.eval.bench import Bench
from fr_agents.eval.metrics import pass_at_k
from fr_agents.policy.base import Engine
from fr_agents.policy.seeded import SeededEngine
from fr_agents.seeding import stable_seed

log = logging.getLogger(__name__)

GREEDY_TEMPERATURE = 1e-6
"""``temperature=0`` (greedy) samples at this temperature: every non-argmax token has probability
``exp(-gap / 1e-6)``, zero in float32, so the draw is the argmax."""


def sample_seed(seed: int, bench: str, task_id: str, sample: int) -> int:
    """The sampling seed of sample ``sample`` of ``task_id`` (see "Seeds" in the module docstring)."""
    return stable_seed("fr-eval", seed, bench, task_id, sample)


def item_seed(seed: int, bench: str, task_id: str) -> int:
    """The env's ``reset`` seed for ``task_id``: the same for all k samples, so they face one problem
    (this matters for envs that draw the problem, or randomise it, from the reset seed)."""
    return stable_seed("fr-eval-env", seed, bench, task_id)


class EvalSettingsMismatch(ValueError):
    """Resuming into a results file written with different settings."""


@dataclass(frozen=True)
class EvalSettings:
    """How samples are drawn. ``None`` limits take the bench's defaults."""

    k: int = 1
    temperature: float = 1.0
    seed: int = 0
    max_new_tokens: int | None = None
    max_turns: int | None = None
    max_context: int | None = None
    system_prompt: str | None = None
    concurrency: int = 32
    compact: bool = True  # an HF engine built for the run takes fr_agents.models.compact where it applies
    dtype: str | None = (
        None  # a live model is evaluated through a copy in this dtype (None: the model itself)
    )

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k: must be >= 1, got {self.k}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature}")
        if self.temperature == 0 and self.k > 1:
            raise ValueError(
                f"k: greedy decoding (temperature 0) gives {self.k} identical "
                "samples; use k=1 or a temperature > 0"
            )
        if self.concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1, got {self.concurrency}")
        for name in ("max_new_tokens", "max_turns", "max_context"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name}: must be >= 1, got {v}")


@dataclass
class BenchResult:
    """The summary of one (checkpoint, bench) pair."""

    label: str
    bench: str
    primary: str
    k: int
    temperature: float
    tasks: int
    samples: int
    metrics: dict[str, float]
    seconds: float
    new_samples: int = 0
    samples_file: str = ""
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headline(self) -> float:
        """The bench's primary metric (``mean@k`` or ``pass@k``) at this ``k``."""
        return self.metrics["mean@k" if self.primary == "mean@k" else f"pass@{self.k}"]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def safe_name(text: str) -> str:
    """A file-name-safe form of a label or bench name."""
    out = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("._")
    return out or "unnamed"


def report_ks(k: int) -> list[int]:
    """The ``j`` of the pass@j columns reported for ``k`` samples: 1, powers of two, and ``k``."""
    ks = {1, k}
    j = 2
    while j < k:
        ks.add(j)
        j *= 2
    return sorted(ks)


def summarize_rows(rows_by_task: dict[str, list[dict[str, Any]]], k: int) -> dict[str, float]:
    """mean@k (avg@k: mean reward), success rate and unbiased pass@j from each task's first k rows."""
    if not rows_by_task:
        raise ValueError("no samples to summarise")
    mean_rewards, success_counts = [], []
    for task_id, rows in rows_by_task.items():
        if len(rows) < k:
            raise ValueError(f"task {task_id!r} has {len(rows)} samples, fewer than k={k}")
        chosen = rows[:k]
        mean_rewards.append(sum(float(r["reward"]) for r in chosen) / k)
        success_counts.append(sum(bool(r["success"]) for r in chosen))
    n_tasks = len(rows_by_task)
    metrics = {
        "mean@k": sum(mean_rewards) / n_tasks,
        "success": sum(success_counts) / (n_tasks * k),
    }
    for j in report_ks(k):
        metrics[f"pass@{j}"] = sum(pass_at_k(k, c, j) for c in success_counts) / n_tasks
    return metrics


def episode_means(rows_by_task: dict[str, list[dict[str, Any]]], k: int) -> dict[str, float]:
    """Mean turns and tool calls per episode over each task's first ``k`` rows (a row without
    ``tool_calls`` counts none: the env reported no tool use)."""
    chosen = [r for rows in rows_by_task.values() for r in rows[:k]]
    n = max(1, len(chosen))
    return {
        "turns": sum(int(r.get("turns", 0)) for r in chosen) / n,
        "tool_calls": sum(int(r.get("tool_calls", 0)) for r in chosen) / n,
    }


def group_means(
    rows_by_task: dict[str, list[dict[str, Any]]], groups: dict[str, str | None], k: int
) -> dict[str, dict[str, float]]:
    """Per group (sorted by name): ``tasks``, ``success``, ``mean@k`` and mean ``turns`` over the
    tasks of that group; empty when no task has a group."""
    out: dict[str, dict[str, float]] = {}
    for g in sorted({g for g in groups.values() if g is not None}):
        rows = {t: r for t, r in rows_by_task.items() if groups.get(t) == g}
        out[g] = {"tasks": len(rows), **summarize_rows(rows, k), "turns": episode_means(rows, k)["turns"]}
    return out


# =========================================================================== the results file


class SampleLog:
    """``<bench>.jsonl`` (one row per finished sample) plus ``<bench>.meta.json`` (the settings)."""

    def __init__(self, out_dir: str | Path, label: str, bench: str) -> None:
        self.dir = Path(out_dir) / "samples" / safe_name(label)
        self.path = self.dir / f"{safe_name(bench)}.jsonl"
        self.meta_path = self.dir / f"{safe_name(bench)}.meta.json"

    def check_settings(self, fingerprint: dict[str, Any]) -> None:
        """Record ``fingerprint``, or raise when the rows on disk were drawn differently."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.meta_path.exists() and self.path.exists():
            old = json.loads(self.meta_path.read_text())
            differ = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            if differ:
                detail = ", ".join(f"{k}: {old.get(k)!r} -> {fingerprint.get(k)!r}" for k in differ)
                raise EvalSettingsMismatch(
                    f"{self.path} holds samples drawn with other settings ({detail}); use another --out "
                    "or delete that file to start over"
                )
            return
        self.meta_path.write_text(json.dumps(fingerprint, indent=2, sort_keys=True))

    def load(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Rows on disk by ``(task_id, sample)``; a torn last line (a crash mid-write) is cut off."""
        if not self.path.exists():
            return {}
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            cut = raw.rfind(b"\n") + 1
            log.warning("%s: dropping a torn last line (%d bytes)", self.path, len(raw) - cut)
            raw = raw[:cut]
            self.path.write_bytes(raw)
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for n, line in enumerate(raw.decode().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path}:{n}: not valid JSON ({e})") from e
            rows[(str(row["task_id"]), int(row["sample"]))] = row
        return rows

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()


# =========================================================================== running


class ItemOptions(gymnasium.Wrapper):
    """Maps the rollout's ``reset(options={"task": item_options})`` to ``reset(options=item_options)``.

    :func:`fr_agents.rollout.run_episode` hands an episode's task to the env as
    ``options={"task": task}``; bench items carry the env's own reset options instead (a game
    file, a task id, or ``{"task": ...}`` for task-dict envs), which this wrapper unpacks.
    """

    last_info: dict[str, Any] | None = None  # the env's info of the last step (kept for the results row)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        inner = (options or {}).get("task") if options else None
        self.last_info = None
        return self.env.reset(seed=seed, options=inner)

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        self.last_info = dict(out[4] or {})
        return out


def rollout_options(bench: Bench, settings: EvalSettings) -> Any:
    """The :class:`~fr_agents.rollout.RolloutOptions` of one sample of ``bench``."""
    from fr_agents.rollout import RolloutOptions

    return RolloutOptions(
        temperature=settings.temperature or GREEDY_TEMPERATURE,
        max_new_tokens=settings.max_new_tokens or bench.max_new_tokens,
        max_context=settings.max_context or bench.max_context,
        max_turns=settings.max_turns or bench.max_turns,
        system_prompt=settings.system_prompt if settings.system_prompt is not None else bench.system_prompt,
        examples=bench.examples,
        branch_factor=1,
    )


def fingerprint(bench: Bench, settings: EvalSettings) -> dict[str, Any]:
    """The settings that define what a stored sample is (compared on resume)."""
    opts = rollout_options(bench, settings)
    return {
        "bench": bench.name,
        "env_id": bench.env_id,
        "env_kwargs": json.loads(json.dumps(bench.env_kwargs, default=repr)),
        "temperature": settings.temperature,
        "seed": settings.seed,
        "max_new_tokens": opts.max_new_tokens,
        "max_turns": opts.max_turns,
        "max_context": opts.max_context,
        "system_prompt": opts.system_prompt,
        **({"examples": [list(t) for t in opts.examples]} if opts.examples else {}),
    }


def _count(value: Any) -> int:
    """An env's count (``info["tool_calls"]``) as an int; 0 when it reported none."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _json_safe(value: Any, max_chars: int = 2000) -> Any:
    """``value`` if it is JSON-serialisable (long strings cut to ``max_chars``), else its repr."""
    if isinstance(value, str):
        return value if len(value) <= max_chars else value[:max_chars] + "…"
    if isinstance(value, dict):
        return {str(k): _json_safe(v, max_chars) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, max_chars) for v in value]
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)[:max_chars]


class LogProgress:
    """An ``on_sample`` for :func:`run_bench_async` that reports progress as log lines (where a live
    bar draws nothing: a log file, CI, a training run's log): one line each time another
    ``1/parts`` of ``total`` samples is done, with the mean reward so far and the minutes since the
    start. ``fr-agents eval`` without a terminal and the trainer's held-out evaluations use it."""

    def __init__(self, name: str, total: int, parts: int = 10) -> None:
        self.name, self.total, self.parts = name, max(1, total), max(1, parts)
        self.done, self.reward = 0, 0.0
        self.started = time.monotonic()

    def advance(self, row: dict[str, Any]) -> None:
        part = self.done * self.parts // self.total
        self.done += 1
        self.reward += float(row.get("reward", 0.0))
        if self.done * self.parts // self.total > part:
            log.info(
                "%s: %d/%d samples, mean reward %.3f, %.1f min",
                self.name,
                self.done,
                self.total,
                self.reward / self.done,
                (time.monotonic() - self.started) / 60,
            )


async def run_bench_async(
    engine: Engine | None,
    tokenizer: Any,
    bench: Bench,
    settings: EvalSettings,
    *,
    label: str,
    out_dir: str | Path,
    make_env: Callable[[], Any] | None = None,
    tree: Any = None,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    actor: Callable[[Any], str] | None = None,
) -> BenchResult:
    """Evaluate ``engine`` on ``bench`` (see the module docstring); async form of :func:`run_bench`.

    ``make_env`` makes fresh (unwrapped) envs, default ``gymnasium.make(bench.env_id, **bench.env_kwargs)``;
    ``tree`` keeps the trajectories (default: an in-memory store, discarded); ``on_sample`` is
    called with each new row (progress bars). ``actor`` (e.g. :func:`fr_agents.rollout.expert_actor`)
    plays instead of ``engine`` (then None): the env's expert is reported like any checkpoint.
    """
    from fr_agents.rollout import run_episode
    from fr_agents.tree import TrajectoryTree

    started = time.perf_counter()
    raw_env = make_env or (lambda: gymnasium.make(bench.env_id, **bench.env_kwargs))
    make_env = lambda: ItemOptions(raw_env())  # noqa: E731
    opts = rollout_options(bench, settings)
    logfile = SampleLog(out_dir, label, bench.name)
    logfile.check_settings(fingerprint(bench, settings))
    done = logfile.load()
    todo = [(item, s) for item in bench.items for s in range(settings.k) if (item.id, s) not in done]
    if done:
        log.info("%s/%s: %d samples already done, %d to go", label, bench.name, len(done), len(todo))
    own_tree = tree is None
    tree = TrajectoryTree() if own_tree else tree
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(item: Any, s: int) -> None:
        seed = sample_seed(settings.seed, bench.name, item.id, s)
        env_seed = item.seed if item.seed is not None else item_seed(settings.seed, bench.name, item.id)
        actions: list[str] = []

        def on_event(kind: str, ev: dict[str, Any]) -> None:
            if kind == "action":
                actions.append(ev["text"])

        async with gate:
            t0 = time.perf_counter()
            env = await asyncio.to_thread(make_env)
            res = await run_episode(
                env,
                SeededEngine(engine, lambda n, s=seed: stable_seed("req", s, n))
                if engine is not None
                else None,
                tokenizer,
                tree,
                opts,
                seed=env_seed,
                task=item.options,
                make_env=make_env,
                on_event=on_event,
                actor=actor,
            )
        leaf = res.leaves[0]
        if (
            leaf.status == "aborted"
        ):  # the grader could not judge it: no score (not a 0); the sample stays to do
            from fr_agents.errors import InfrastructureFailure

            raise InfrastructureFailure(
                str(leaf.info.get("aborted_by", "unknown")), str(leaf.info.get("abort_message", ""))
            )
        won = leaf.info.get("won")
        row = {
            "checkpoint": label,
            "bench": bench.name,
            "task_id": item.id,
            "group": item.group,
            "sample": s,
            "seed": seed,
            "env_seed": env_seed,
            "reward": float(leaf.reward),
            "success": bool(won) if isinstance(won, bool) else leaf.reward > 0,
            "status": leaf.status,
            "partial_score": leaf.partial_score,
            "turns": leaf.turns,
            "tool_calls": _count(leaf.info.get("tool_calls")),
            "policy_tokens": leaf.policy_tokens,
            "actions": actions,
            "info": _json_safe(leaf.info),
            "env_info": _json_safe(env.last_info or {}),
            "seconds": round(time.perf_counter() - t0, 4),
        }
        logfile.append(row)
        done[(item.id, s)] = row
        if on_sample is not None:
            on_sample(row)

    try:
        await asyncio.gather(*(one(item, s) for item, s in todo))
    finally:
        if own_tree:
            tree.close()
    by_task = {item.id: [done[(item.id, s)] for s in range(settings.k)] for item in bench.items}
    return BenchResult(
        label=label,
        bench=bench.name,
        primary=bench.primary,
        k=settings.k,
        temperature=settings.temperature,
        tasks=len(bench.items),
        samples=len(bench.items) * settings.k,
        metrics=summarize_rows(by_task, settings.k),
        seconds=time.perf_counter() - started,
        new_samples=len(todo),
        samples_file=str(logfile.path),
        description=bench.description,
        extra={
            "per_episode": episode_means(by_task, settings.k),
            "by_group": group_means(by_task, {item.id: item.group for item in bench.items}, settings.k),
        },
    )


def run_bench(engine: Engine, tokenizer: Any, bench: Bench, settings: EvalSettings, **kw: Any) -> BenchResult:
    """:func:`run_bench_async` from synchronous code (runs its own event loop)."""
    return asyncio.run(run_bench_async(engine, tokenizer, bench, settings, **kw))
