"""The ``fr-agents`` command line.

Each subcommand is a pair of functions: ``_add_<name>(sub)`` declares its arguments and
``_cmd_<name>(args) -> int`` runs it. Heavy imports happen inside ``_cmd_*`` so that
``fr-agents --help`` stays fast. This is the only module of ``fr_agents`` that may import
``envs``, ``tools_sandbox`` or ``trainer``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fr_agents import defaults
from fr_agents.config import ConfigError

log = logging.getLogger("fr_agents.cli")

_COMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]] = []


def command(name: str, help: str) -> Callable:
    """Decorator: register ``fn(args) -> int`` as subcommand ``name``; :func:`args` (placed under it)
    declares its arguments."""

    def wrap(fn: Callable[..., int]) -> Callable[..., int]:
        _COMMANDS.append((name, help, getattr(fn, "_add", lambda p: None), fn))
        return fn

    return wrap


def args(add: Callable[[argparse.ArgumentParser], None]) -> Callable:
    """Decorator placed under :func:`command`: attach the argument declarations."""

    def wrap(fn: Callable[..., int]) -> Callable[..., int]:
        fn._add = add  # type: ignore[attr-defined]
        return fn

    return wrap


# =========================================================================== doctor


def _doctor_rows() -> list[tuple[str, bool, str]]:
    rows: list[tuple[str, bool, str]] = []

    def mod(name: str, fix: str, label: str | None = None) -> None:
        ok = importlib.util.find_spec(name) is not None
        detail = ""
        if ok:
            try:
                detail = getattr(importlib.import_module(name), "__version__", "")
            except Exception as e:  # noqa: BLE001 - report, never crash the doctor
                ok, detail = False, f"import failed: {e}"
        rows.append((label or name, ok, str(detail) if ok else f"{detail} -> {fix}".strip()))

    mod("torch", "pip install torch==2.13.0 (CPU) or your CUDA build")
    mod("transformers", "pip install 'transformers>=5.16.1,<5.20'")
    mod("gymnasium", "pip install gymnasium")
    mod("math_verify", "pip install 'math-verify[antlr4-13-2]'", "math-verify")
    mod("vllm", "bash scripts/setup.sh --vllm (CPU) or pip install 'fr-agents[vllm]' (GPU)")
    mod("ray", "pip install 'fr-agents[ray]'")
    mod("alfworld", "bash scripts/setup.sh --alfworld")
    bwrap = shutil.which("bwrap")
    rows.append(("bwrap", bwrap is not None, bwrap or "apt-get install bubblewrap"))
    docker_ok, docker_detail = False, "apt-get install docker.io && bash scripts/setup.sh --docker"
    if shutil.which("docker"):
        try:
            out = subprocess.run(
                ["docker", "version", "--format", "{{.Server.Version}}"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if out.returncode == 0 and out.stdout.strip():
                docker_ok, docker_detail = True, f"daemon {out.stdout.strip()}"
            else:
                docker_detail = "client found but no daemon answers -> bash scripts/setup.sh --docker"
        except (OSError, subprocess.TimeoutExpired) as e:
            docker_detail = f"docker did not answer ({e}) -> bash scripts/setup.sh --docker"
    rows.append(("docker daemon", docker_ok, docker_detail))
    return rows


def _add_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--strict", action="store_true", help="exit 1 when any component is missing")


@command("doctor", "report which components are available and how to get the missing ones")
@args(_add_doctor)
def _cmd_doctor(a: argparse.Namespace) -> int:
    rows = _doctor_rows()
    if a.json:
        print(json.dumps({n: {"ok": ok, "detail": d} for n, ok, d in rows}))
    else:
        for name, ok, detail in rows:
            print(f"{'ok     ' if ok else 'missing'}  {name:<14} {detail}")
    return 1 if a.strict and not all(ok for _, ok, _ in rows) else 0


# =========================================================================== envs


@command("envs", "list the registered environment ids, one line each")
def _cmd_envs(a: argparse.Namespace) -> int:
    import gymnasium

    import envs  # noqa: F401  (registers the built-in ids)
    from fr_agents.registry import BUILTIN_ENVS

    for env_id in sorted(k for k in gymnasium.registry if k.startswith("fr_agents/")):
        doc = BUILTIN_ENVS.get(env_id, ("", ""))[1]
        print(f"{env_id:<32} {doc}")
    return 0


# =========================================================================== (subcommands are added below)


# =========================================================================== simulate-elastic


def _add_simulate_elastic(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="xlong",
        help="xlong, tool or alfworld (trainer/elastic/simulator.py documents each)",
    )
    p.add_argument("--gpus", type=int, default=16, help="devices in the cluster")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (speedup_vs_colocated, speedup_vs_static_async, ...)",
    )
    p.add_argument("--plot", metavar="PNG", help="write the elastic run's pool sizes over time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--steps", type=int, default=None, help="learner steps to simulate (default: the workload's)"
    )


@command("simulate-elastic", "simulate colocated-sync vs best static async vs elastic pools on a workload")
@args(_add_simulate_elastic)
def _cmd_simulate_elastic(a: argparse.Namespace) -> int:
    from trainer.elastic.simulator import main_simulate

    return main_simulate(a.workload, a.gpus, as_json=a.json, plot=a.plot, seed=a.seed, steps=a.steps)


# =========================================================================== eval


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoints",
        nargs="*",
        metavar="CHECKPOINT",
        help="tiny, a model/checkpoint dir, a run dir (its latest checkpoint) or a hub id",
    )
    p.add_argument("--bench", action="append", default=[], help="bench name (repeatable); --list shows them")
    p.add_argument("-k", type=int, default=1, help="samples per problem (pass@1..k, mean@k)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"0 = greedy (k must be 1). Default: a run's own choice (greedy at k 1, as its held-out "
        f"figures are played; its trainer.eval_temperature at k > 1, as its avg@k evaluations), "
        f"else {defaults.TEMPERATURE}",
    )
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "openai"])
    p.add_argument("--out", help="output folder (samples/, results.json, results.md, results.png)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="a seeded sample of N problems of each bench (not the first N: stored order is often sorted); "
        "the same sample fr-agents train evaluates on with tasks.seed = --limit-seed",
    )
    p.add_argument("--limit-seed", type=int, default=0, help="seed of the --limit sample (default 0)")
    p.add_argument(
        "--env-kwargs",
        default=None,
        help="JSON object merged over each bench's gymnasium.make kwargs (e.g. the env kwargs a run "
        "trained with: '{\"list_admissible\": false}' for alfworld-tiny)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: the bench's)")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--system-prompt", default=None)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="episodes played at once, the hf engine's batch (default: a run's rollout.concurrency, else 32)",
    )
    p.add_argument("--label", action="append", default=[], help="report name of each CHECKPOINT, in order")
    p.add_argument(
        "--dtype",
        default=None,
        help="dtype the checkpoints sample in (default: the dtype a run's own evaluations sampled in, "
        "rollout.dtype resolved on this machine, else float32)",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--base-url", default=None, help="--engine openai: server URL ending in /v1")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer for --engine openai/vllm (default: CHECKPOINT) and --agent expert (default: tiny)",
    )
    p.add_argument("--list", action="store_true", help="list the bench names and exit")
    p.add_argument(
        "--agent",
        choices=["expert"],
        default=None,
        help="expert: evaluate the env's own expert (expert_action()) instead of checkpoints, label 'expert'",
    )


def _run_config(checkpoints: list[str]) -> Path | None:
    """The ``config.yaml`` of the run the checkpoints come from (a run dir, or a checkpoint inside
    one), None when they come from none; refused when they come from runs of different configs."""
    from fr_agents.config import load_config
    from fr_agents.config_io import to_dict
    from fr_agents.run_layout import CHECKPOINT_DIR, CONFIG_FILE

    found: dict[str, Path] = {}
    for arg in checkpoints:
        p = Path(arg)
        run = (
            p if (p / CONFIG_FILE).is_file() else p.parent.parent if p.parent.name == CHECKPOINT_DIR else None
        )
        if run is not None and (run / CONFIG_FILE).is_file():
            cfg = to_dict(load_config(str(run / CONFIG_FILE)))  # what a bench of the run depends on:
            key = json.dumps(
                [cfg["env"], cfg["tasks"], cfg["rollout"]["max_new_tokens"], cfg["rollout"]["max_context"]],
                sort_keys=True,
                default=str,
            )
            found.setdefault(key, run / CONFIG_FILE)
    if len(found) > 1:
        raise ConfigError(
            "CHECKPOINT: the checkpoints come from runs that played their benches differently (env, tasks "
            "or reply limits); evaluate each run on its own"
        )
    return next(iter(found.values()), None)


def _eval_checkpoint(arg: str, engine: str) -> str:
    """A run directory becomes its latest checkpoint; anything else is passed through."""
    from pathlib import Path

    from fr_agents.run_layout import CHECKPOINT_DIR, latest_checkpoint

    if engine != "openai" and (Path(arg) / CHECKPOINT_DIR).is_dir():
        ckpt = latest_checkpoint(arg)
        if ckpt is None:
            raise ConfigError(f"CHECKPOINT: run directory {arg} has no complete checkpoint")
        return str(ckpt)
    return arg


@command("eval", "evaluate checkpoints on benches: pass@k, mean@k, a comparison table and plot")
@args(_add_eval)
def _cmd_eval(a: argparse.Namespace) -> int:
    from envs.benches import BenchUnavailable, list_benches, resolve_bench
    from fr_agents.eval import suite
    from fr_agents.eval.runner import EvalSettings, EvalSettingsMismatch
    from fr_agents.models import ModelNotFoundError, load_tokenizer

    if a.list:
        for name, doc in list_benches():
            print(f"{name:<18} {doc}")
        return 0
    if a.agent == "expert" and a.checkpoints:
        raise ConfigError("CHECKPOINT: --agent expert evaluates the expert; give no checkpoints with it")
    if not a.checkpoints and a.agent is None:
        raise ConfigError("CHECKPOINT: give at least one checkpoint (or --list, or --agent expert)")
    if not a.bench:
        raise ConfigError("--bench: give at least one bench (--list shows them)")
    if not a.out:
        raise ConfigError("--out: the output folder is required")
    try:
        run_config = _run_config(a.checkpoints)
        if run_config is not None and None in (a.dtype, a.concurrency, a.temperature):
            # evaluate as the run's own evaluations did: same dtype, same batch of episodes, and
            # greedy at k 1 (its held-out figures, trainer/evaluate.py) or its eval_temperature at k > 1
            from fr_agents.config import load_config

            run_cfg = load_config(str(run_config))
            a.dtype = run_cfg.engine_dtype if a.dtype is None else a.dtype
            a.concurrency = max(1, run_cfg.rollout.concurrency) if a.concurrency is None else a.concurrency
            if a.temperature is None:
                a.temperature = (
                    defaults.HELD_OUT_TEMPERATURE if a.k == 1 else run_cfg.trainer.eval_temperature
                )
            print(
                f"eval: as the run at {run_config.parent} evaluated: {a.dtype}, "
                f"{a.concurrency} episodes at once, "
                + ("greedy" if a.temperature == 0 else f"temperature {a.temperature:g}"),
                file=sys.stderr,
            )
        a.temperature = defaults.TEMPERATURE if a.temperature is None else a.temperature
        a.dtype = "float32" if a.dtype is None else a.dtype
        a.concurrency = 32 if a.concurrency is None else a.concurrency
        settings = EvalSettings(
            k=a.k,
            temperature=a.temperature,
            seed=a.seed,
            max_new_tokens=a.max_new_tokens,
            max_turns=a.max_turns,
            max_context=a.max_context,
            system_prompt=a.system_prompt,
            concurrency=a.concurrency,
        )
        benches = [resolve_bench(name, a.limit, a.limit_seed, run_config) for name in a.bench]
        if a.env_kwargs:
            extra = _json_kwargs(a.env_kwargs, "--env-kwargs")
            try:
                benches = [b.with_env_kwargs(extra) for b in benches]
            except ValueError as e:
                raise ConfigError(f"--env-kwargs: {e}") from e
        if a.agent == "expert":
            results = suite.evaluate_expert(
                benches, settings, out_dir=a.out, tokenizer=load_tokenizer(a.tokenizer or "tiny")
            )
        else:
            results = suite.evaluate_checkpoints(
                [_eval_checkpoint(c, a.engine) for c in a.checkpoints],
                suite.eval_labels(a.checkpoints, a.label),
                benches,
                settings,
                out_dir=a.out,
                engine=a.engine,
                dtype=a.dtype,
                device=a.device,
                base_url=a.base_url,
                api_key=a.api_key,
                tokenizer=a.tokenizer,
            )
    except ConfigError:
        raise
    except (ValueError, BenchUnavailable, ModelNotFoundError, EvalSettingsMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(suite.report(results, a.out))
    return 0


# =========================================================================== repo-tasks


def _add_repo_tasks(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="repo_tasks_cmd", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build (or reuse) a RepoCoding-v0 task set in DIR")
    b.add_argument("--out", required=True, help="output folder (tasks.jsonl, repos/, manifest.json)")
    b.add_argument("--seed", type=int, default=0, help="mutation sampling seed (default 0)")
    b.add_argument("--repos", nargs="+", default=None, help="repo names, or seed / real / all (default all)")
    b.add_argument("--quota", type=int, default=None, help="tasks per repository (default: per-repo setting)")
    b.add_argument("--workers", type=int, default=2, help="parallel test runs (default 2)")
    b.add_argument(
        "--cache-dir", default=None, help="sdist + test-run cache (default ~/.cache/fr_agents/repo_coding)"
    )
    b.add_argument("--force", action="store_true", help="rebuild even when DIR holds the same build")
    s = sub.add_parser("stats", help="count the tasks of a task file/folder per repo and mutation kind")
    s.add_argument("path", help="tasks.jsonl / .parquet, or a folder holding tasks.jsonl")
    v = sub.add_parser(
        "validate", help="grade each task's gold patch (must score 1) and empty diff in a sandbox"
    )
    v.add_argument("path", help="tasks.jsonl / .parquet, or a folder holding tasks.jsonl")
    v.add_argument("--backend", default="auto", help="auto (default), docker or bwrap")
    v.add_argument("--limit", type=int, default=None, help="only the first N tasks")


@command(
    "repo-tasks", "RepoCoding-v0 tasks: `repo-tasks build --out DIR [--seed S]`, `repo-tasks stats PATH`"
)
@args(_add_repo_tasks)
def _cmd_repo_tasks(a: argparse.Namespace) -> int:
    import time
    from collections import Counter

    from envs.repo_coding.task import load_tasks

    if a.repo_tasks_cmd == "build":
        from envs.repo_coding.builder import build_tasks

        t0 = time.monotonic()
        try:
            tasks = build_tasks(
                a.out,
                seed=a.seed,
                repos=a.repos,
                cache_dir=a.cache_dir,
                workers=a.workers,
                quota=a.quota,
                force=a.force,
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        per_repo = Counter(t.repo for t in tasks)
        print(
            json.dumps(
                {
                    "out": a.out,
                    "tasks": len(tasks),
                    "per_repo": per_repo,
                    "seconds": round(time.monotonic() - t0, 1),
                },
                indent=1,
            )
        )
        return 0 if tasks else 1
    tasks = load_tasks(a.path)
    if a.repo_tasks_cmd == "validate":
        from envs.repo_coding.grading import validate

        bad = 0
        for t in tasks[: a.limit]:
            row = validate(t, backend=a.backend)
            bad += not row["ok"]
            print(json.dumps(row))
        return 1 if bad else 0
    print(
        json.dumps(
            {
                "tasks": len(tasks),
                "per_repo": Counter(t.repo for t in tasks),
                "per_kind": Counter(t.mutation.get("kind", "?") for t in tasks),
            },
            indent=1,
        )
    )
    return 0


# =========================================================================== sandbox


def _add_sandbox(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="sandbox_cmd", metavar="ACTION")
    b = sub.add_parser(
        "build-image", help="debootstrap + docker import the sandbox image (cached by recipe hash)"
    )
    b.add_argument("--force", action="store_true", help="rebuild the rootfs and re-import even when cached")
    b.add_argument(
        "--rootfs-only", action="store_true", help="only debootstrap the rootfs (no Docker needed)"
    )
    g = sub.add_parser(
        "gc", help="remove sandboxes (containers, bwrap processes, cgroups) whose owner is gone"
    )
    g.add_argument("--all", action="store_true", help="also remove sandboxes of live owners")
    sub.add_parser("status", help="which sandbox backends work here, and why not")


@command("sandbox", "sandboxes: `sandbox build-image`, `sandbox gc [--all]`, `sandbox status`")
@args(_add_sandbox)
def _cmd_sandbox(a: argparse.Namespace) -> int:
    if a.sandbox_cmd == "build-image":
        from tools_sandbox.image import build_image

        try:
            tag = build_image(force=a.force, docker=not a.rootfs_only)
        except RuntimeError as e:
            print(f"build-image failed: {e}", file=sys.stderr)
            return 1
        print(tag)
        return 0
    if a.sandbox_cmd == "gc":
        from tools_sandbox.reaper import gc

        removed = gc(all_owners=a.all)
        for backend, items in removed.items():
            print(f"{backend}: removed {len(items)}" + "".join(f"\n  {i}" for i in items))
        return 0
    if a.sandbox_cmd == "status":
        from tools_sandbox import backend_status, resolve_backend

        for backend, (ok, detail) in backend_status().items():
            print(f"{'ok     ' if ok else 'missing'}  {backend:<7} {detail}")
        try:
            print(f"auto -> {resolve_backend('auto')}")
        except Exception as e:  # noqa: BLE001 - report the reason
            print(f"auto -> unavailable: {e}")
            return 1
        return 0
    print("usage: fr-agents sandbox {build-image,gc,status}", file=sys.stderr)
    return 2


# =========================================================================== alfworld


def _add_alfworld(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="alfworld_cmd", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write offline ALFWorld games (game.tw-pddl + traj_data.json)")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--n", type=int, default=None, help="training games (default 300)")
    g.add_argument("--seen", type=int, default=140, help="valid_seen games (train scenes)")
    g.add_argument("--unseen", type=int, default=134, help="valid_unseen games (held-out scenes)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")


@command("alfworld", "ALFWorld tools: `alfworld generate --out DIR --n N --seed S`")
@args(_add_alfworld)
def _cmd_alfworld(a: argparse.Namespace) -> int:
    from pathlib import Path

    from envs.alfworld.generate import DEFAULT_COUNTS, generate

    counts = {
        "train": DEFAULT_COUNTS["train"] if a.n is None else a.n,
        "valid_seen": a.seen,
        "valid_unseen": a.unseen,
    }
    for name, n in (("--n", counts["train"]), ("--seen", a.seen), ("--unseen", a.unseen)):
        if n < 0:
            raise ConfigError(f"{name} must be >= 0, got {n}")
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]games"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(
        *columns, console=Console(stderr=True), transient=True
    ) as bar:  # stdout keeps the one JSON line
        job = bar.add_task("games", total=sum(counts.values()))
        records = generate(a.out, counts, seed=a.seed, workers=a.workers, on_game=lambda _: bar.advance(job))
    manifest = json.loads((Path(a.out) / "manifest.json").read_text())
    by_split: dict[str, int] = {}
    for r in records:
        by_split[r.split] = by_split.get(r.split, 0) + 1
    print(
        json.dumps(
            {
                "out": a.out,
                "games": by_split,
                "seconds": manifest["seconds"],
                "content_hash": manifest["content_hash"],
            }
        )
    )
    return 0


# =========================================================================== store


def _add_store(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="store_cmd", metavar="ACTION", required=True)
    st = sub.add_parser("stats", help="print the store's counts as JSON")
    st.add_argument("path", help="trajectory store file (SQLite)")
    sh = sub.add_parser("show", help="print the tree indented, with tokens, rewards and versions per node")
    sh.add_argument("path", help="trajectory store file (SQLite)")
    sh.add_argument("--root", type=int, default=None, help="only this root id")
    sh.add_argument("--ids", action="store_true", help="print token ids instead of decoded text")
    sh.add_argument("--max-tokens", type=int, default=12, help="token ids shown per node (with --ids)")
    sh.add_argument("--max-chars", type=int, default=160, help="characters of decoded text shown per node")
    sh.add_argument(
        "--model",
        default=None,
        help="tokenizer to decode with (default: the run's own when PATH lies in a run directory, else tiny)",
    )


@command("store", "inspect a trajectory store: `store stats PATH`, `store show PATH [--root N] [--ids]`")
@args(_add_store)
def _cmd_store(a: argparse.Namespace) -> int:
    from pathlib import Path

    from fr_agents.tree import TrajectoryTree
    from fr_agents.tree.show import render

    if not Path(a.path).is_file():
        print(f"path: no store at {a.path}", file=sys.stderr)
        return 2
    decode = None
    if a.store_cmd == "show" and not a.ids:
        from fr_agents.models import ModelNotFoundError
        from fr_agents.view.decode import TokenText
        from fr_agents.view.layout import locate, tokenizer_source

        try:
            decode = TokenText.load(tokenizer_source(locate(a.path), a.model)).text
        except (ModelNotFoundError, OSError) as e:
            print(f"--model: cannot load a tokenizer ({e}); --ids prints token ids", file=sys.stderr)
            return 2
    with TrajectoryTree.open(a.path) as tree:
        if a.store_cmd == "stats":
            print(json.dumps(tree.stats(), indent=2))
            return 0
        if a.root is not None and a.root not in tree.roots():
            print(f"--root: {a.root} is not a root id (roots: {tree.roots()[:20]})", file=sys.stderr)
            return 2
        print(render(tree, a.root, max_tokens=a.max_tokens, decode=decode, max_chars=a.max_chars))
        return 0


# =========================================================================== view


def _add_view(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a run directory (runs/<run>) or a trajectory store file")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0: any free port)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1, this machine only; the page has no password)",
    )
    p.add_argument(
        "--model",
        default=None,
        help=(
            "tokenizer for decoding (default: the run's own; a bare store file "
            "needs the model that wrote it, else tiny)"
        ),
    )


@command("view", "a local web page over a run or a trajectory store: curves, trees, tokens (live)")
@args(_add_view)
def _cmd_view(a: argparse.Namespace) -> int:
    from fr_agents.view import serve

    try:
        return serve(a.path, host=a.host, port=a.port, model=a.model)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# =========================================================================== model


def _add_model(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="model_cmd", metavar="ACTION", required=True)
    c = sub.add_parser("create-tiny", help="build the deterministic tiny model into DIR")
    c.add_argument("dir")
    c.add_argument("--size", default="micro", choices=["nano", "micro", "small"])
    c.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("get", help="resolve a model name to a local HF directory (building/converting once)")
    g.add_argument("name", help="tiny, tiny-<size>, smollm2-135m, a local directory or a hub id")


@command("model", "create the tiny model or fetch/convert a default model")
@args(_add_model)
def _cmd_model(a: argparse.Namespace) -> int:
    from fr_agents.models import ModelNotFoundError, create_tiny, resolve_model

    if a.model_cmd == "create-tiny":
        print(create_tiny(a.dir, size=a.size, seed=a.seed))
        return 0
    try:
        print(resolve_model(a.name))
    except ModelNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


# =========================================================================== rollout


class _EnvIdError(ValueError):
    """An env id gymnasium cannot make; the message lists the closest registered ids."""


def _make_env_factory(env_id: str, kwargs: dict) -> Callable[[], object]:
    """Check ``env_id`` once (suggesting close ids) and return a factory making fresh envs."""
    import difflib

    import gymnasium

    import envs  # noqa: F401  (registers the built-in ids)

    known = sorted(gymnasium.registry)
    try:
        gymnasium.make(env_id, **kwargs).close()
    except gymnasium.error.Error as e:
        close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.4)
        hint = (
            f"; did you mean {', '.join(close)}?" if close else "; `fr-agents envs` lists the registered ids"
        )
        raise _EnvIdError(f"ENV_ID: cannot make {env_id!r} ({e}){hint}") from e
    return lambda: gymnasium.make(env_id, **kwargs)


def _json_kwargs(text: str | None, field: str) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{field}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{field}: must be a JSON object, got {type(value).__name__}")
    return value


def _add_rollout(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", metavar="ENV_ID")
    p.add_argument("--model", default="tiny", help="tiny, tiny-<size>, smollm2-135m, a local dir or a hub id")
    p.add_argument(
        "--agent",
        choices=["expert"],
        default=None,
        help="expert: the env's expert_action() plays; its replies are stored as non-policy tokens "
        "(SFT demos, leaf info demo_spans) tokenized with --model's tokenizer",
    )
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--out", required=True, help="trajectory store file (SQLite) to write")
    p.add_argument("--branch", type=int, default=1, help="branch factor K at each --branch-at turn")
    p.add_argument(
        "--branch-at", default="0", help="comma-separated turn boundaries to branch at (0 = prompt)"
    )
    p.add_argument("--temperature", type=float, default=defaults.TEMPERATURE)
    p.add_argument("--max-new-tokens", type=int, default=defaults.MAX_NEW_TOKENS)
    p.add_argument("--max-context", type=int, default=defaults.MAX_CONTEXT)
    p.add_argument("--max-turns", type=int, default=defaults.MAX_TURNS)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="episode i is reset with seed+i")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--env-kwargs", default=None, help="JSON object passed to gymnasium.make")
    p.add_argument("--dtype", default="float32")


@command("rollout", "run N episodes with a model and store them in a durable trajectory tree")
@args(_add_rollout)
def _cmd_rollout(a: argparse.Namespace) -> int:
    from fr_agents.collect import collect
    from fr_agents.models import ModelNotFoundError, load_policy, load_tokenizer
    from fr_agents.policy.hf import HFEngine
    from fr_agents.rollout import RolloutOptions, expert_actor, require_expert

    if a.episodes < 1:
        raise ConfigError(f"--episodes: must be >= 1, got {a.episodes}")
    try:
        branch_at = tuple(int(x) for x in a.branch_at.split(",") if x.strip())
    except ValueError as e:
        raise ConfigError(f"--branch-at: expected comma-separated integers, got {a.branch_at!r}") from e
    if a.agent == "expert" and a.branch > 1:
        raise ConfigError("--branch: the expert is deterministic; branching would store one path K times")
    try:
        opts = RolloutOptions(
            temperature=a.temperature,
            max_new_tokens=a.max_new_tokens,
            max_context=a.max_context,
            max_turns=a.max_turns,
            system_prompt=a.system_prompt,
            branch_factor=a.branch,
            branch_at=branch_at,
        )
        make_env = _make_env_factory(a.env_id, _json_kwargs(a.env_kwargs, "--env-kwargs"))
        if a.agent == "expert":
            require_expert(make_env, a.env_id)
            engine, tokenizer = None, load_tokenizer(a.model)
        else:
            model, tokenizer = load_policy(a.model, a.dtype)
            engine = HFEngine(model, tokenizer)
    except ConfigError:
        raise
    except (ValueError, ModelNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        lines = collect(
            make_env,
            engine,
            tokenizer,
            a.out,
            a.episodes,
            opts,
            concurrency=a.concurrency,
            seed=a.seed,
            actor=expert_actor if a.agent == "expert" else None,
        )
    finally:
        if engine is not None:
            engine.close_sync()
    print("\n".join(lines))
    return 0


# =========================================================================== play


def _add_play(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", metavar="ENV_ID")
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--model",
        default=None,
        help="play with this model (default: tiny); a run directory plays its "
        "latest checkpoint with the run's prompt, env kwargs and limits (flags given here win)",
    )
    who.add_argument("--human", action="store_true", help="you type the actions (stdin, pipes work)")
    who.add_argument(
        "--agent", choices=["expert"], default=None, help="expert: the env's expert_action() plays"
    )
    p.add_argument(
        "--temperature", type=float, default=None, help=f"default {defaults.TEMPERATURE} (a run: its own)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=None, help=f"default {defaults.MAX_NEW_TOKENS} (a run: its own)"
    )
    p.add_argument(
        "--max-context", type=int, default=None, help=f"default {defaults.MAX_CONTEXT} (a run: its own)"
    )
    p.add_argument(
        "--max-turns", type=int, default=None, help=f"default {defaults.MAX_TURNS} (a run: its own)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-prompt", default=None)
    p.add_argument(
        "--env-kwargs", default=None, help="JSON object passed to gymnasium.make (over a run's own)"
    )


@command("play", "play one episode in the terminal, as a model or as a human (--human)")
@args(_add_play)
def _cmd_play(a: argparse.Namespace) -> int:
    from fr_agents import play
    from fr_agents.models import ModelNotFoundError, load_policy
    from fr_agents.rollout import RolloutOptions, example_turns

    run_config = _run_config([a.model]) if a.model else None
    ran: dict = {}
    if run_config is not None:  # a run plays as it trained, unless a flag here says otherwise
        from fr_agents.config import load_config

        cfg = load_config(str(run_config))
        if cfg.env.id != a.env_id:
            raise ConfigError(f"--model: the run trained on {cfg.env.id}, not {a.env_id}")
        ran = {
            "env_kwargs": dict(cfg.env.kwargs),
            "temperature": cfg.rollout.temperature,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "max_context": cfg.rollout.max_context,
            "max_turns": cfg.env.max_turns,
            "system_prompt": cfg.env.system_prompt,
            "examples": example_turns(cfg.env.examples),
        }
    max_turns = a.max_turns or ran.get("max_turns", defaults.MAX_TURNS)
    try:
        make_env = _make_env_factory(
            a.env_id, {**ran.get("env_kwargs", {}), **_json_kwargs(a.env_kwargs, "--env-kwargs")}
        )
    except _EnvIdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = make_env()
    if a.human or a.agent == "expert":
        try:
            return (play.play_human if a.human else play.play_expert)(env, a.seed, max_turns)
        finally:
            env.close()
    try:
        opts = RolloutOptions(
            temperature=a.temperature
            if a.temperature is not None
            else ran.get("temperature", defaults.TEMPERATURE),
            max_new_tokens=a.max_new_tokens or ran.get("max_new_tokens", defaults.MAX_NEW_TOKENS),
            max_context=a.max_context or ran.get("max_context", defaults.MAX_CONTEXT),
            max_turns=max_turns,
            system_prompt=a.system_prompt if a.system_prompt is not None else ran.get("system_prompt"),
            examples=ran.get("examples", ()),
        )
        model, tokenizer = load_policy(_eval_checkpoint(a.model, "hf") if a.model else "tiny")
    except (ValueError, ModelNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return play.play_model(env, make_env, model, tokenizer, opts, a.seed)


# =========================================================================== train


def _train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR exactly from its latest checkpoint")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help=(
            "print the resolved config (each value with its help), the checks and "
            "the placement plan; start nothing; exit 2 when the real run would refuse"
        ),
    )
    p.add_argument("--run-dir", help="write the run here (default run.out_dir/<preset>-<time>)")
    p.add_argument(
        "--env",
        metavar="MODULE:ID",
        help="train on your own gymnasium env (e.g. mypkg.envs:me/Guess-v0) with the tiny model, tasks from "
        "the env's own reset() and multi-turn defaults (preset env-tiny); overrides still apply",
    )


def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "preset", nargs="?", default=None, help="a shipped preset's name or a YAML path (default math-tiny)"
    )
    # REMAINDER so that flags may follow the overrides: `train math-tiny x=1 --dry-run y=2`
    p.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="dotted key=value overrides, e.g. trainer.steps=50"
    )
    _train_flags(p)


@command("train", "train a policy with asynchronous FlashREINFORCE on a preset or YAML config")
@args(_add_train)
def _cmd_train(a: argparse.Namespace) -> int:
    from trainer.loop import main_train

    late = argparse.ArgumentParser(prog="fr-agents train", add_help=False)
    _train_flags(late)
    flags, overrides = late.parse_known_args(a.overrides or [])
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        raise ConfigError(f"train: unknown option(s) {' '.join(unknown)} (see fr-agents train --help)")
    return main_train(
        a.preset,
        overrides,
        resume=flags.resume or a.resume,
        dry_run=flags.dry_run or a.dry_run,
        run_dir=flags.run_dir or a.run_dir,
        env=flags.env or a.env,
    )


# =========================================================================== main


# The order `fr-agents --help` lists commands in: the main job first, tools last.
_HELP_ORDER = (
    "train",
    "play",
    "rollout",
    "eval",
    "envs",
    "model",
    "store",
    "view",
    "sandbox",
    "alfworld",
    "repo-tasks",
    "simulate-elastic",
    "doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fr-agents",
        description="Train LLM agents with asynchronous FlashREINFORCE on multi-turn environments.",
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    order = {n: i for i, n in enumerate(_HELP_ORDER)}
    for name, help_text, add, fn in sorted(_COMMANDS, key=lambda c: order.get(c[0], len(order))):
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(_fn=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    from fr_agents.log import setup_logging

    parser = build_parser()
    a = parser.parse_args(argv)
    setup_logging(a.log_level)
    if not getattr(a, "_fn", None):
        parser.print_help()
        return 0
    try:
        return int(a._fn(a) or 0)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
