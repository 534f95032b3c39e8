"""Tree RL vs linear FlashREINFORCE at equal sampled policy tokens, and the learner's cost per token.

Run: ``python benchmarks/tree_rl.py [--quick] [--task two-attempts|tool-result|uncertain-tokens]
[--seeds 0 1 2] [--steps N] [--baseline batch nodes ...]``.

The task: ``math-tiny`` (sums with the in-code tiny model) as a **two-attempt** task
(``MathVerifier-v0(max_turns=2)``): a wrong first answer gets ``"Your answer X is incorrect. Try
again."`` and the agent answers again, so the second attempt matters and it is where a tree forks: a
tree episode shares the prompt, the first attempt and the feedback, and forks ``--branch`` second
attempts there (``rollout.branch_at=[1]``), trained with ``trainer.max_per_root=5`` (J_max) and, by
default, the same objective as the linear run (``--baseline batch``, the batch-mean baseline), so the
two runs differ only in how they sample; ``--baseline tree`` trains the tree run with the tree baseline
(each leaf also against the leaves sharing its branching node). Linear FlashREINFORCE samples one
path per prompt.
``--branch-at 0 1`` forks the first reply too (``rollout.branch_at=[0, 1]``: up to ``--branch`` ** 2
leaves a root, J_max of them trained), so a root also holds several first attempts.

``--task tool-result`` runs the same comparison on ``python-tool-tiny`` (4-digit products through the
bwrap sandbox, the preset's expert warm start): there a tree forks the answer turn after the tool
result (``rollout.branch_at=[1]``), so every leaf of a root shares the prompt, the tool call and what
the sandbox printed, about 70 of its ~80 tokens; it is where packing has the most to save.

``--task uncertain-tokens`` is where tree RL should pay: ``math-smollm2`` (SmolLM2-135M-Instruct
adding two-digit numbers after one worked example, a short reasoning step and a ``\\boxed{}`` answer)
with a tree that forks the reply *itself* where the policy is uncertain
(``rollout.branch_policy=token``, ``rollout.branch_at=[0]``): each root samples one reply, and
``--branch - 1`` (default 3) continuations keep it up to one of its highest-entropy tokens and sample
the rest afresh (``rollout.branch_entropy=0``: the top tokens whatever their entropy). The leaves of
a root share the prompt (with its example, ~100 tokens) and the reply's head. The linear run takes 30
steps by default; periodic evaluation is off (held-out before and after only). ``--baseline batch
nodes`` trains one tree run per baseline on the same budget: ``nodes`` credits each token with the
value of the branch it chose (``objective.baseline=nodes``, trainer/objective.py). A step of the
135M model costs ~100x the tiny one's, so its learner cost is timed on 4 batches per window, once.

Equal budget: the linear run takes ``--steps`` steps and samples ``T`` policy tokens (the engine's
count for its trained batches, from the run's ledger: a fork's shared part is sampled once, and
siblings whose continuations came out identical are each counted, though the tree stores them once).
A 2-step pilot of the tree run measures its tokens per step, and the tree run gets as many steps as
give about ``T`` tokens; since tokens per step change as the policy learns, the tree run is then
resumed from its last checkpoint for the tokens still missing until it has sampled at least 95% of
``T``. The tokens each run's store holds (each node once) are printed too, with the tree run's
leaves trained per step (after merging identical siblings and J_max), the sampled leaves those rows
stand for (a merged row is trained as its identical siblings' count) and merges per step. (Before
the ledger kept the engine's count, this budget counted stored nodes, which charged a tree run
nothing for the identical siblings it merged.)

``trainer.batch_size`` counts leaves at full branching. Identical forked siblings are merged into
one row trained as that many samples, so a tree step trains on fewer *rows* than a linear one but
on about as many sampled leaves (fewer where J_max drops distinct leaves or an episode ends before
its branching turn). ``--match-samples`` sizes the tree run's ``trainer.batch_size`` from a 4-step
pilot so that both runs train on about ``--batch-size`` sampled leaves per step (the rows' weights);
``--match-leaves`` so that both train on about ``--batch-size`` rows (distinct leaves) per step,
which gives a tree step several times the samples of a linear one (kept to reproduce figures from
before merged rows were weighted). ``--match-steps`` holds the optimizer steps equal instead: the tree
run takes the linear run's step count, with a ``trainer.batch_size`` (whole trees) at which, by the
pilot's tokens per tree, a tree step samples as many policy tokens as a linear step did or fewer
(whole trees, rounded down; the resume above then tops the budget up to 95% if it falls short); so
both runs take as many Adam updates from the same token budget, and a tree step holds several times
the roots of a ``--match-samples`` one. (At equal samples per step the tree run takes ~3x the steps
of the linear one, each on a quarter of its prompts.) Held-out success (greedy, both attempts, the
test split) after RL is reported per seed and as mean and spread over ``--seeds``.

Learner cost: two sets of tree batches of each tree run (20 each; 4 for uncertain-tokens), its last
ones (the converged policy, whose forked siblings mostly agree and merge) and as many spread over the
whole run, are stepped (on copies of
the final model) in three forms (:func:`learner_cost`): the tree's step (its distinct leaves in the
learner's per-root packed form, tree attention or the dense per-root mask, whichever it picks, each
weighted by the sampled leaves it stands for), the flat form of every sampled leaf (identical
siblings as separate rows: the same gradient, what a trainer without the tree steps), and the flat
form of the distinct leaves. Logical tokens are root-to-leaf lengths, one path per sampled leaf (a
path sampled twice is two logical paths and one stored path, as in the sharing ratio). The goal's
figure (>= 2x) is learner seconds per logical token, flat form of the batch as sampled over the
tree's step; beside it, flat over packed on the distinct leaves alone (what packing saves without the
merge of identical siblings), each with its ideal ratio (logical / packed tokens). ``--cost-only``
measures it again on the tree runs of an earlier ``--out`` folder. Ratios are the result, not
absolute times.
"""

from __future__ import annotations

import argparse
import collections
import copy
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the run's shape, whatever the task: a fixed number of steps, no mid-run checkpoints or plots, no
# collapse guard (a comparison reports what each run reaches)
RUN_SHAPE = [
    "trainer.max_minutes=0",
    "trainer.plateau_patience=0",
    "trainer.checkpoint_every=0",
    "trainer.plot_every=1000",
    "trainer.collapse_guard=false",
]

TWO_ATTEMPTS = [
    "env.kwargs={answer_format: plain, max_turns: 2, feedback: true}",
    "env.max_turns=2",
    "rollout.max_context=96",
    *RUN_SHAPE,
]


# python-tool-tiny as it ships (expert warm start, bwrap sandbox): a tree forks the answer turn after
# the tool result, so every leaf of a root shares the prompt, the tool call and what the sandbox
# printed (~70 of its ~80 tokens)
TOOL_RESULT = RUN_SHAPE

# math-smollm2 as it ships (SmolLM2-135M-Instruct, one worked example, \\boxed{} answers), a fixed
# number of steps and no periodic evaluation: a tree forks the reply itself at its most uncertain
# tokens (rollout.branch_policy=token), so the leaves of a root share the prompt and the reply's head
UNCERTAIN_TOKENS = [*RUN_SHAPE, "trainer.eval_every=0"]


@dataclass(frozen=True)
class Task:
    """One comparison: the preset and overrides both runs share, and the task's defaults."""

    preset: str
    overrides: list[str]
    tiny: bool = True  # the in-code tiny model: model.tiny_size and model.tiny_seed apply
    steps: int = 60  # steps of the linear run
    branch: int = 8  # rollout.branch_factor of the tree run
    branch_at: tuple[int, ...] = (1,)
    tree: tuple[str, ...] = ()  # the tree run's branching rule, beyond branch_factor and branch_at
    cost_batches: int = 20  # batches per learner-cost window
    cost_repeat: int = 3  # timed steps per batch and form (the median counts)


TASKS = {
    "two-attempts": Task("math-tiny", TWO_ATTEMPTS),
    "tool-result": Task("python-tool-tiny", TOOL_RESULT),
    # a 135M model's step costs ~100x the tiny one's: fewer, single-timed learner-cost batches
    "uncertain-tokens": Task(
        "math-smollm2",
        UNCERTAIN_TOKENS,
        tiny=False,
        steps=30,
        branch=4,
        branch_at=(0,),
        tree=("rollout.branch_policy=token", "rollout.branch_entropy=0"),
        cost_batches=4,
        cost_repeat=1,
    ),
}


def sampled_policy_tokens(run: Path, steps: int) -> int:
    """Policy tokens the engine sampled for the run's ``steps`` trained batches (the ledger's count)."""
    from fr_agents.ledger import EpisodeLedger

    ledger = EpisodeLedger(run / "episodes.sqlite")
    try:
        counts = [ledger.sampled_tokens(k) for k in range(steps)]
    finally:
        ledger.close()
    if any(c is None for c in counts):
        raise RuntimeError(
            f"{run}: the ledger has batches without the engine's token count (a run from older code)"
        )
    return sum(counts)  # type: ignore[arg-type]


def stored_policy_tokens(run: Path) -> int:
    """Policy tokens stored in the run's tree, each node once."""
    from fr_agents.tree import TrajectoryTree
    from fr_agents.tree.batch import node_spans

    tree = TrajectoryTree.open(run / "store.sqlite")
    trajs = tree.trajectories(tree.leaf_ids())
    seen: set[int] = set()
    total = 0
    for traj, spans in zip(trajs, node_spans(trajs), strict=True):
        for node, a, b in spans:
            if node not in seen:
                seen.add(node)
                total += sum(traj.policy_mask[a:b])
    tree.close()
    return total


def slim(run: Path, keep_model: bool = True) -> None:
    """Free the disk a finished run no longer needs: its checkpoints' optimizer state and rollout
    weights, and every model but the last one's (the learner cost reads it); ``keep_model=False``:
    the whole checkpoints folder. A SmolLM2 checkpoint is ~2.2 GB, so a 3-seed uncertain-tokens run
    would otherwise keep ~40 GB."""
    import shutil

    folder = run / "checkpoints"
    if not keep_model:
        shutil.rmtree(folder, ignore_errors=True)
        return
    latest = (folder / "LATEST").read_text().strip() if (folder / "LATEST").is_file() else ""
    for step in folder.glob("step_*"):
        if step.name != Path(latest).name:
            shutil.rmtree(step, ignore_errors=True)
            continue
        (step / "trainer_state.pt").unlink(missing_ok=True)
        shutil.rmtree(step / "rollout_weights", ignore_errors=True)


def train(run: Path, task: str, overrides: list[str], resume: bool = False) -> dict[str, float]:
    import json

    from fr_agents.config import load_config
    from trainer.loop import run_training

    cfg = load_config(TASKS[task].preset, [*TASKS[task].overrides, *overrides])
    res = run_training(cfg, run, console=False, resume=resume)
    if not res.ok:
        raise RuntimeError(f"{run}: {res.stop_reason}")
    after = res.evals.get("after_rl", {})
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = {
        r["step"]: r for r in rows if r.get("kind") == "step"
    }  # a resumed run logs each step once more at most
    return {
        "success": float(after.get("success", math.nan)),
        "tokens": float(sampled_policy_tokens(run, res.steps)),
        "stored_tokens": float(stored_policy_tokens(run)),
        "steps": res.steps,
        "temperature": cfg.rollout.temperature,
        "leaves_per_step": statistics.mean(r["leaves"] for r in steps.values()) if steps else math.nan,
        "merged_per_step": statistics.mean(r.get("merged", 0.0) for r in steps.values())
        if steps
        else math.nan,
        "samples_per_step": statistics.mean(r.get("samples", r["leaves"]) for r in steps.values())
        if steps
        else math.nan,
    }


def learner_cost(
    run: Path,
    steps: int,
    batches: Sequence[int],
    temperature: float,
    micro_batch_tokens: int,
    repeat: int = 3,
    autocast: str = "",
) -> tuple[dict[str, float], dict[str, int]]:
    """Learner seconds over the run's ``batches`` (indices), each stepped on the
    final model (step ``steps``; median of ``repeat`` per batch and form) in three forms:

    * ``packed``: the tree's step: its distinct leaves in the learner's own packed path (tree
      attention or the dense per-root mask, whichever it picks), each weighted by the sampled
      leaves it stands for (identical siblings merged);
    * ``flat``: the same distinct leaves, one padded row each (what packing alone saves);
    * ``flat_sampled``: every sampled leaf its own row, identical siblings included: the flat
      form of the batch as sampled, which gives the weighted packed step's gradient (tested in
      ``tests/trainer/test_tree_rl.py``) and is what a trainer without the tree would step.

    Returns the seconds of each form and the token counts: logical tokens (root-to-leaf lengths)
    ``distinct`` over the distinct leaves and ``sampled`` over every sampled leaf (a path sampled
    twice is two logical paths, stored once), and ``packed`` (the tokens the packed form holds)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fr_agents.ledger import EpisodeLedger
    from fr_agents.models.forward import ForwardConfig
    from fr_agents.tree import TrajectoryTree
    from fr_agents.tree.batch import build_flat, build_packed
    from trainer.learner import Chunking, Learner

    ledger, tree = EpisodeLedger(run / "episodes.sqlite"), TrajectoryTree.open(run / "store.sqlite")
    model = AutoModelForCausalLM.from_pretrained(
        run / "checkpoints" / f"step_{steps:06d}", dtype=torch.float32
    )
    seconds = {"flat": 0.0, "packed": 0.0, "flat_sampled": 0.0}
    distinct = sampled = packed_tokens = 0
    for k in batches:
        counts = collections.Counter(r[1] for r in ledger.batch_rows(k))  # leaf -> sampled leaves it holds
        trajs = tree.trajectories(sorted(counts))
        if not trajs:
            continue
        weights = [counts[t.leaf_id] for t in trajs]
        every = [t for t, w in zip(trajs, weights, strict=True) for _ in range(w)]
        probe = build_packed(trajs)
        distinct += int(probe.flat.lengths.sum())
        sampled += sum(
            counts[int(leaf)] * int(n)
            for leaf, n in zip(probe.flat.leaf_ids, probe.flat.lengths, strict=True)
        )
        packed_tokens += probe.num_tokens
        build = {  # each form's builder and its arguments (built afresh for every timed step)
            "flat": (build_flat, trajs, None),
            "packed": (build_packed, trajs, weights),
            "flat_sampled": (build_flat, every, None),
        }
        times: dict[str, list[float]] = {form: [] for form in seconds}
        for _ in range(repeat):  # alternate the forms so that a change of load hits all alike
            for form in times:
                m = copy.deepcopy(model)
                builder, rows, w = build[form]
                batch = builder(rows, weights=w)
                learner = Learner(
                    m,
                    torch.optim.SGD(m.parameters(), lr=0.0),
                    chunking=Chunking(
                        micro_batch_tokens=micro_batch_tokens,
                        packed="always" if form == "packed" else "never",
                    ),
                    forward=ForwardConfig(temperature=temperature, autocast=autocast),
                )
                t0 = time.perf_counter()
                learner.step(batch)
                times[form].append(time.perf_counter() - t0)
        for form in seconds:
            seconds[form] += statistics.median(times[form])
    ledger.close()
    tree.close()
    return seconds, {"distinct": distinct, "sampled": sampled, "packed": packed_tokens}


# the batches whose learner cost is measured: the run's last n (the converged policy, where forked
# siblings agree most) and n spread evenly over the whole run (n: the task's cost_batches)
COST_WINDOWS = {
    "last batches": lambda steps, n: range(max(0, steps - n), steps),
    "batches across the run": lambda steps, n: range(0, steps, max(1, steps // n)),
}

# the two ratios reported per window: (key, what it compares, the goal's note). Each compares two
# forms over the same logical tokens, so the ratio of seconds per logical token is that of seconds.
COST_RATIOS = [
    (
        "sampled",
        "learner s per sampled logical token, flat form of every sampled leaf / the tree's packed step",
        " (goal >= 2)",
    ),
    ("distinct", "learner s per logical token of the distinct leaves, flat / packed (packing alone)", ""),
]


def learner_costs(
    run: Path, steps: int, temperature: float, task: Task, autocast: str = ""
) -> dict[str, dict[str, float]]:
    """Per window of :data:`COST_WINDOWS`: the ratios of :data:`COST_RATIOS` and their ideals."""
    out = {}
    for name, window in COST_WINDOWS.items():
        seconds, tokens = learner_cost(
            run,
            steps,
            window(steps, task.cost_batches),
            temperature,
            0,
            repeat=task.cost_repeat,
            autocast=autocast,
        )
        packed = max(1, tokens["packed"])
        out[name] = {
            "sampled": seconds["flat_sampled"] / seconds["packed"],
            "ideal_sampled": tokens["sampled"] / packed,
            "distinct": seconds["flat"] / seconds["packed"],
            "ideal_distinct": tokens["distinct"] / packed,
        }
    return out


def cost_line(costs: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{name}: learner s/logical token, flat of every sampled leaf / packed "
        f"{c['sampled']:.2f}x (ideal {c['ideal_sampled']:.2f}x), distinct leaves "
        f"flat / packed {c['distinct']:.2f}x (ideal {c['ideal_distinct']:.2f}x)"
        for name, c in costs.items()
    )


def cost_summary(per_seed: list[dict[str, dict[str, float]]]) -> None:
    for name in COST_WINDOWS:
        for key, what, goal in COST_RATIOS:
            print(
                f"  {what} ({name} of each tree run): {spread([c[name][key] for c in per_seed])}x{goal}; "
                f"ideal (logical / packed tokens) {spread([c[name]['ideal_' + key] for c in per_seed])}x"
            )


def spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} +- {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def tree_run_name(baseline: str, baselines: Sequence[str], seed: int) -> str:
    """``tree-SEED`` for the first tree arm (what ``--cost-only`` reads), ``tree-BASELINE-SEED`` for
    the others."""
    return f"tree-{seed}" if baseline == baselines[0] else f"tree-{baseline}-{seed}"


def main() -> None:
    from fr_agents.config import BASELINES, load_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="two-attempts",
        help="two-attempts: math-tiny with a second attempt after a wrong answer (the fork); tool-result: "
        "python-tool-tiny, forked after the sandbox's reply; uncertain-tokens: math-smollm2 "
        "(SmolLM2-135M), the reply forked at its highest-entropy tokens",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps of the linear run (default: the task's, 60; 30 for uncertain-tokens)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="leaves per step (both runs)")
    p.add_argument(
        "--branch",
        type=int,
        default=None,
        help=(
            "continuations forked at each branch turn (rollout.branch_factor; "
            "default: the task's, 8; 4 for uncertain-tokens)"
        ),
    )
    p.add_argument(
        "--branch-at",
        type=int,
        nargs="+",
        default=None,
        help=(
            "the turns where a tree forks (rollout.branch_at; default 1: the second "
            "attempt, or the answer after the tool result; 0 for uncertain-tokens); "
            "e.g. 0 1 also forks the first reply, branch ** 2 leaves at most"
        ),
    )
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument(
        "--warm-start",
        type=int,
        default=0,
        help="warm-start demos (both runs, reported apart; 0: 500 for two-attempts, the preset's otherwise)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes that prove the script works")
    p.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    p.add_argument(
        "--match-leaves",
        action="store_true",
        help="give the tree run a trainer.batch_size (episodes x branch) at which, by the pilot, about "
        "--batch-size leaves per step survive merging and J_max, as the linear run trains on",
    )
    p.add_argument(
        "--match-samples",
        action="store_true",
        help="give the tree run a trainer.batch_size (episodes x branch) at which, by the pilot, its rows "
        "stand for about --batch-size sampled leaves per step, as the linear run trains on",
    )
    p.add_argument(
        "--baseline",
        choices=BASELINES,
        nargs="+",
        default=["batch"],
        help=(
            "the tree run's objective.baseline, one tree run per value: batch (the product's default, "
            "as the linear run: the two runs then differ only in how they sample), tree (each leaf "
            "also against its branching node's leaves) or nodes (per token, the tree's node values)"
        ),
    )
    p.add_argument(
        "--match-steps",
        action="store_true",
        help=(
            "give the tree run the linear run's step count, with a trainer.batch_size "
            "(whole trees) at which, by the pilot, a tree step samples at most the "
            "linear step's policy tokens (whole trees, rounded down)"
        ),
    )
    p.add_argument(
        "--cost-only", action="store_true", help="only the learner cost, on the tree runs in --out"
    )
    a = p.parse_args()
    task = TASKS[a.task]
    a.steps = a.steps or task.steps
    a.branch = a.branch or task.branch
    a.branch_at = a.branch_at or list(task.branch_at)
    if a.match_leaves + a.match_samples + a.match_steps > 1:
        p.error("--match-leaves, --match-samples and --match-steps: choose one")
    shared_cfg = load_config(
        task.preset, task.overrides
    )  # the runs' own temperature and learner dtype (not overridden)
    if a.cost_only:
        if not a.out:
            p.error("--cost-only: needs --out, the folder of an earlier run")
        costs = []
        for seed in a.seeds:
            run = Path(a.out) / f"tree-{seed}"
            step = int((run / "checkpoints" / "LATEST").read_text().strip().rsplit("_", 1)[-1])
            costs.append(
                learner_costs(run, step, shared_cfg.rollout.temperature, task, shared_cfg.learner_autocast)
            )
            print(f"seed {seed}: {cost_line(costs[-1])}", flush=True)
        cost_summary(costs)
        return
    if a.quick:
        a.seeds, a.steps, a.batch_size, a.eval_episodes = [0], 3, 8, 20
        if task.tiny:
            a.branch, a.warm_start = 4, 64
    if not a.warm_start:
        a.warm_start = 500 if a.task == "two-attempts" else shared_cfg.warm_start.examples
    out = Path(a.out or tempfile.mkdtemp(prefix="tree_rl_"))
    common = [
        f"trainer.batch_size={a.batch_size}",
        f"trainer.eval_episodes={a.eval_episodes}",
        f"warm_start.examples={a.warm_start}",
    ]
    if task.tiny:
        common.append("model.tiny_size=micro")
    if a.quick and task.tiny:
        common += ["warm_start.epochs=2", "model.tiny_size=nano"]
        if a.task == "tool-result":  # nano's smaller vocabulary spells the expert's call in more tokens
            common += ["rollout.max_new_tokens=40", "rollout.max_context=160"]
    fan = a.branch ** len(a.branch_at)  # leaves of a fully branched tree: trainer.batch_size's unit
    base_over = [
        f"rollout.branch_factor={a.branch}",
        f"rollout.branch_at=[{','.join(map(str, a.branch_at))}]",
        "trainer.max_per_root=5",
        *task.tree,
    ]
    rows = []
    for seed in a.seeds:
        s = [f"trainer.seed={seed}", *([f"model.tiny_seed={seed}"] if task.tiny else [])]
        lin = train(out / f"linear-{seed}", a.task, [*common, *s, f"trainer.steps={a.steps}"])
        slim(out / f"linear-{seed}", keep_model=False)
        pilot_steps = 4 if a.match_leaves or a.match_samples or a.match_steps else 2
        pilot = train(
            out / f"pilot-{seed}",
            a.task,
            [
                *common,
                *s,
                *base_over,
                f"objective.baseline={a.baseline[0]}",
                f"trainer.steps={pilot_steps}",
                "trainer.eval_episodes=0",
            ],
        )
        slim(out / f"pilot-{seed}", keep_model=False)
        per_step = max(1.0, pilot["tokens"] / pilot_steps)
        tree_batch = a.batch_size
        if (
            a.match_leaves or a.match_samples
        ):  # episodes so that about batch_size rows (samples) are trained a step
            trained = pilot["samples_per_step"] if a.match_samples else pilot["leaves_per_step"]
            tree_batch = max(fan, round(a.batch_size * a.batch_size / trained / fan) * fan)
        elif a.match_steps:  # whole trees so that a step samples at most about the linear step's tokens
            per_tree = per_step / max(1.0, a.batch_size / fan)
            tree_batch = max(fan, math.floor(lin["tokens"] / lin["steps"] / per_tree) * fan)
        per_step *= tree_batch / a.batch_size
        trees = {}
        for baseline in a.baseline:
            tree_over = [*base_over, f"objective.baseline={baseline}", f"trainer.batch_size={tree_batch}"]
            run = out / tree_run_name(baseline, a.baseline, seed)
            steps = lin["steps"] if a.match_steps else max(1, round(lin["tokens"] / per_step))
            tree = train(run, a.task, [*common, *s, *tree_over, f"trainer.steps={steps}"])
            # tokens per step drift as the policy learns: resume for the missing tokens, at the
            # run's own rate so far, until the tree run has sampled at least 95% of the linear run's
            for _ in range(6):
                if tree["tokens"] >= 0.95 * lin["tokens"]:
                    break
                steps = tree["steps"] + max(
                    1, round((lin["tokens"] - tree["tokens"]) * tree["steps"] / max(1.0, tree["tokens"]))
                )
                tree = train(run, a.task, [*common, *s, *tree_over, f"trainer.steps={steps}"], resume=True)
            costs = learner_costs(run, tree["steps"], tree["temperature"], task, shared_cfg.learner_autocast)
            slim(run)  # the last model stays, for --cost-only
            trees[baseline] = (tree, costs)
            print(
                f"seed {seed}: linear {lin['steps']} steps {lin['tokens']:,.0f} tok -> success "
                f"{lin['success']:.3f} | tree (baseline {baseline}) {tree['steps']} steps "
                f"{tree['tokens']:,.0f} tok -> success {tree['success']:.3f} (batch_size {tree_batch}, "
                f"leaves trained per step {tree['leaves_per_step']:.1f} standing for "
                f"{tree['samples_per_step']:.1f} sampled, merged siblings per step "
                f"{tree['merged_per_step']:.1f}) | {cost_line(costs)}",
                flush=True,
            )
        rows.append((seed, lin, trees))
    print(
        f"[tree RL] {task.preset} ({a.task}), {len(a.seeds)} seeds, runs in "
        f"{out}; load average {load_average()}"
    )
    lin_success = [r[1]["success"] for r in rows]
    print(
        f"  linear: held-out success {spread(lin_success)}, sampled policy tokens "
        f"{spread([r[1]['tokens'] for r in rows])}, stored {spread([r[1]['stored_tokens'] for r in rows])}"
    )
    for baseline in a.baseline:
        tree_success = [r[2][baseline][0]["success"] for r in rows]
        gain = [t - x for t, x in zip(tree_success, lin_success, strict=True)]
        print(
            f"  tree (J_max=5, baseline {baseline}): held-out success {spread(tree_success)} (tree - "
            f"linear {spread(gain)}, goal >= +0.02), sampled policy tokens "
            f"{spread([r[2][baseline][0]['tokens'] for r in rows])}, stored "
            f"{spread([r[2][baseline][0]['stored_tokens'] for r in rows])}"
        )
        cost_summary([r[2][baseline][1] for r in rows])


def load_average() -> str:
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
