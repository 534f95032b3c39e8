"""``fr-agents train``: resolve the config, check everything, then hand over to the loop.

Order of business, so that a mistake costs seconds, not a warm start:

1. load the preset or YAML and apply the ``key=value`` overrides (an invalid key is a
   :class:`~fr_agents.config.ConfigError` naming it);
2. ``--dry-run``: print the resolved config, the checks and the placement plan and return; the exit
   code is the real run's verdict (0: it would start, 2: a check fails, as a real run's config error);
3. preflight: the model, the env id (registered and importable), the task source, the device;
4. create the run directory (or reopen it with ``--resume``) and run :class:`trainer.loop.Trainer`
   (with :class:`~trainer.elastic.runtime.ElasticHooks` under ``trainer.elastic=true``), or the
   Ray backend (:func:`trainer.ray_backend.run_training_ray`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from fr_agents.config import ConfigError, TrainConfig, dump_config, load_config
from fr_agents.run_layout import CHECKPOINT_DIR, CONFIG_FILE

log = logging.getLogger(__name__)


def resolve_run_dir(cfg: TrainConfig, run_dir: str | None) -> Path:
    if run_dir:
        return Path(run_dir)
    name = cfg.run.name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.out_dir) / name


ENV_PRESET = "env-tiny"
"""The preset behind ``fr-agents train --env MODULE:ID``: the tiny model, tasks from the env's own
reset (``tasks.source=env-reset``), multi-turn episodes."""


def load_run_config(
    preset: str | None, overrides: list[str], resume: str | None, *, env: str | None = None
) -> TrainConfig:
    """The config of a new run, or of the run being resumed (with optional overrides on top).

    ``env``: train on that gymnasium id with the :data:`ENV_PRESET` defaults (``--env``).
    """
    if preset and "=" in preset:  # `fr-agents train key=value --resume DIR`
        overrides = [preset, *overrides]
        preset = None
    if env is not None:
        if preset or resume:
            raise ConfigError(
                "--env: give either --env MODULE:ID, a preset or --resume RUN_DIR, not two of them"
            )
        if not env.strip():
            raise ConfigError("--env: expected a gymnasium id such as mypkg.envs:me/Guess-v0")
        return load_config(ENV_PRESET, [f"env.id={env}", *overrides])
    if resume:
        saved = Path(resume) / CONFIG_FILE
        if not saved.exists():
            raise ConfigError(f"--resume: {resume} has no {CONFIG_FILE} (not a run directory)")
        if preset:
            raise ConfigError("--resume: give either a preset or --resume RUN_DIR, not both")
        return load_config(str(saved), overrides)
    return load_config(preset or "math-tiny", overrides)


def main_train(
    preset: str | None,
    overrides: list[str] | None = None,
    *,
    resume: str | None = None,
    dry_run: bool = False,
    run_dir: str | None = None,
    env: str | None = None,
) -> int:
    """The ``fr-agents train`` command. Returns the process exit code."""
    cfg = load_run_config(preset, list(overrides or []), resume, env=env)
    from trainer.os_tuning import onednn_cache_capacity

    onednn_cache_capacity(cfg)  # before any product of this process, and inherited by the ones it starts
    from trainer.preflight import dry_run_report, run_preflight

    if dry_run:
        pf = run_preflight(cfg, import_env=False)
        print(dry_run_report(cfg, pf))
        return 0 if pf.ok else 2
    run_preflight(cfg).raise_if_failed()
    if resume:
        out = Path(resume)
    else:
        out = resolve_run_dir(cfg, run_dir)
        if (out / CHECKPOINT_DIR).exists() and any((out / CHECKPOINT_DIR).iterdir()):
            raise ConfigError(f"run directory {out} already holds a run; use --resume {out} to continue it")
        out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / CONFIG_FILE)
    if cfg.trainer.backend == "ray":
        from trainer.ray_backend import run_training_ray

        result = run_training_ray(cfg, out, resume=bool(resume))
    else:
        from trainer.hooks import TrainerHooks
        from trainer.loop import Trainer

        hooks: list[TrainerHooks] = []
        if cfg.trainer.elastic:  # the elastic runtime: hooks on the plain trainer
            from trainer.elastic import ElasticHooks

            t = cfg.trainer
            hooks.append(ElasticHooks(cfg, devices=t.devices, rollout=t.rollout_devices or t.devices - 1))
        result = Trainer(cfg, out, console=True, hooks=hooks).run(resume=bool(resume))
    print(result.summary())
    return 0 if result.ok else 1
