"""ALFWorld-v0 latency: reset and step, and the cost of offline game generation.

Prints, from one run on this machine:
* generation seconds per game (sampling + PDDL translation + planning + replay check),
* ``reset`` latency (load the game, translate the PDDL with Fast Downward, first observation),
* ``step`` latency (apply one command, list admissible commands, partial score),
* ``fork`` latency (fresh engine + replay), and the ratios step/reset and fork/reset.

    python benchmarks/alfworld.py [--games 6] [--games-dir DIR]

``--schedule`` measures instead what the engine pool (:data:`envs.alfworld.engine.ENGINE_POOL`) saves
on a training run's resets: the train games of ``--games-dir`` minus the first ``--demos`` (the warm
start's, as ``fr-agents train`` splits them) are visited in the order of the trainer's own episode
schedule (``--batch`` episodes a step, ``--episodes`` in all), each episode a reset and one ``look``,
its engine returned to the pool at the end, once for each ``--capacity``. Prints pool hits, reset
seconds per episode, and the ratio against the first capacity given::

    python benchmarks/alfworld.py --schedule --games-dir DIR --demos 48 --batch 8 --episodes 160 \
--capacity 32 128

``--split`` measures where an RL step's rollout goes on ``--preset`` (default alfworld-smollm2, its real model
and prompt; alfworld-smollm2-tree plays its trees, ``--batch`` leaves in all): one step's episodes
(``--batch``, all live at once, the preset's first RL games) played by the preset's engine, once with the
engine's continuations off (every turn prefills the whole conversation, as the engine did before it kept
finished rows) and once on. For each it prints the wall time, the seconds inside ALFWorld's engine (under its
process-wide lock, by call), the rest (generation, tokenizing, tree writes), and the prefill tokens per
sampled token. ``--run DIR`` adds that run's learner step (median seconds, from its ``metrics.jsonl``)::

    python benchmarks/alfworld.py --split --games-dir DIR [--batch 16] [--run RUN_DIR] [model.name=CHECKPOINT]

``--paid RUN_DIR`` reads what a run's RL episodes that ended unwon but partially paid actually did:
how many there were, their partial scores, and ``--sample`` of them (seeded) as command lists, with
the conditions they met (to check that the partial score pays only for progress)::

    python benchmarks/alfworld.py --paid RUN_DIR [--sample 12]

``--credit RUN_DIR`` reads which way a run's loss pushed each kind of command: every RL row of a full batch
with its advantage under the batch baseline (learner reward minus the batch's mean), its replies by kind
(``open``, ``use``, ``go``, ``take``, ``move``, and object commands without the object's number, which the
engine refuses), and per kind its share of the replies of rows above and below the mean and the sum over
rows of advantage x the kind's share of the row's replies (the sign the sample-mean loss gives that kind)::

    python benchmarks/alfworld.py --credit RUN_DIR

``--forks RUN_DIR`` reads where a tree run's (``alfworld-smollm2-tree``) RL tokens went: its trees and leaves,
the forks (nodes with more than one child) where two children began with the same command (the fork resampled
the reply it forked on, so the siblings differ only later), the trees whose leaves all scored the same (the
nodes baseline gives them no credit), the rows merged as identical siblings and pruned by J_max, and the
policy tokens the engine sampled against those on the trained root-to-leaf paths::

    python benchmarks/alfworld.py --forks RUN_DIR
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

# `python benchmarks/alfworld.py` puts this folder first on sys.path, where this file would shadow
# the `alfworld` package: drop it, and make the repository importable.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))


def schedule(a: argparse.Namespace) -> None:
    """The engine pool's hits and reset time on a training schedule (see the module docstring)."""
    from envs.alfworld.engine import ENGINE_POOL
    from envs.alfworld.env import ALFWorldEnv
    from envs.tasks.alfworld import AlfworldSource
    from trainer.batches import EpisodeSchedule

    games = [t["metadata"]["game"] for t in AlfworldSource(games_dir=a.games_dir).split("train")][a.demos :]
    if not games:
        raise SystemExit(f"--games-dir {a.games_dir}: no train games after the first {a.demos}")
    sched = EpisodeSchedule(num_tasks=len(games), batch_size=a.batch, seed=a.seed, task_seed=a.seed)
    order = [games[e.task_index] for k in range(-(-a.episodes // a.batch)) for e in sched.episodes(k)][
        : a.episodes
    ]
    print(
        f"# engine pool on a training schedule: {len(games)} RL games, {a.episodes} episodes, "
        f"{a.batch} a step, {len(set(order))} distinct (load average {os.getloadavg()[0]:.1f})"
    )
    base = None
    for capacity in a.capacity:
        ENGINE_POOL.clear()
        ENGINE_POOL.capacity, ENGINE_POOL.hits, ENGINE_POOL.misses = capacity, 0, 0
        took: dict[bool, list[float]] = {True: [], False: []}  # reset seconds, by pool hit
        for k in range(0, len(order), a.batch):  # a step's episodes are live together, then end
            envs = [ALFWorldEnv(split="train", games_dir=a.games_dir) for _ in order[k : k + a.batch]]
            for env, game in zip(envs, order[k : k + a.batch], strict=True):
                hits, t0 = ENGINE_POOL.hits, time.perf_counter()
                env.reset(options={"game": game})
                took[ENGINE_POOL.hits > hits].append(time.perf_counter() - t0)
                env.step("look")
            for env in envs:
                env.close()
        per = sum(took[True] + took[False]) / len(order)
        base = base or per
        medians = ", ".join(
            f"{name} {statistics.median(took[hit]):.2f} s"
            for hit, name in ((True, "hit"), (False, "miss"))
            if took[hit]
        )
        print(
            f"capacity {capacity:>4}: hits {ENGINE_POOL.hits}/{len(order)}, reset "
            f"{per:.2f} s/episode ({per / base:.2f}x capacity {a.capacity[0]}; "
            f"median {medians}), load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    ENGINE_POOL.clear()


def split(a: argparse.Namespace) -> None:
    """Where one RL step's rollout time goes, continuations off and on (see the module docstring)."""
    import asyncio
    import json

    import torch

    from envs.alfworld.engine import ENGINE_CLOCK, ENGINE_POOL
    from fr_agents.config import load_config
    from fr_agents.policy.opening import Continuations
    from trainer.parts import build_rollout_side

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    cfg = load_config(
        a.preset,
        [
            f"tasks.params.games_dir={a.games_dir}",
            f"trainer.batch_size={a.batch}",
            f"rollout.concurrency={a.batch}",
            *a.overrides,
        ],
    )
    print(
        f"# {a.preset}: one step of {a.batch} episodes, all live at once, max_turns {cfg.env.max_turns}, "
        f"{len(os.sched_getaffinity(0))} cores (load average {os.getloadavg()[0]:.1f})"
    )
    for mode, keep in (("continuations off", 0), ("continuations on", Continuations().max_tokens)):
        with tempfile.TemporaryDirectory() as run:
            side = build_rollout_side(cfg, Path(run), with_engine=True)
            engine = side.runner.engine
            engine.continuations = Continuations(keep)
            ENGINE_POOL.clear()
            ENGINE_CLOCK.clear()
            specs = side.schedule.episodes(0)

            async def play(specs=specs, side=side):
                return await asyncio.gather(*(side.runner.run(spec) for spec in specs))

            t0 = time.perf_counter()
            outcomes = asyncio.run(play())
            wall = time.perf_counter() - t0
            side.close()
        st = engine.stats
        sampled = st["tokens"]
        turns = sum(leaf.turns for o in outcomes for leaf in o.leaves)  # every branch of a tree
        inside = ENGINE_CLOCK.total()
        calls = ", ".join(
            f"{k} {v:.1f} s/{ENGINE_CLOCK.calls[k]}" for k, v in sorted(ENGINE_CLOCK.seconds.items())
        )
        print(
            f"{mode:>18}: wall {wall:.1f} s | ALFWorld engine {inside:.1f} s ({inside / wall:.0%}; {calls}) "
            f"| rest {wall - inside:.1f} s | {turns} turns, {sampled} sampled tokens, "
            f"{st['prefill_tokens']} prefilled ({st['prefill_tokens'] / max(1, sampled):.1f} per sampled "
            f"token; {st['continued_tokens']} continued) | mean reward "
            f"{sum(o.reward for o in outcomes) / len(outcomes):.3f}",
            flush=True,
        )
    if a.run:
        steps = [json.loads(line) for line in (Path(a.run) / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in steps if r.get("kind") == "step" and "step_seconds" in r]
        if steps:
            med = statistics.median(r["step_seconds"] for r in steps)
            wall = statistics.median(
                y["elapsed_s"] - x["elapsed_s"] for x, y in zip(steps, steps[1:], strict=False)
            )
            print(
                f"learner ({a.run}): median step {med:.1f} s (forward, backward, optimizer) of a median "
                f"{wall:.1f} s between steps, over {len(steps)} steps"
            )


def paid(a: argparse.Namespace) -> None:
    """What the run's unwon but partially paid RL episodes did (see the module docstring)."""
    import collections
    import random

    from fr_agents.config import load_config
    from fr_agents.models import resolve_model
    from fr_agents.run_layout import CONFIG_FILE
    from fr_agents.tree import TrajectoryTree
    from fr_agents.view.decode import TokenText

    cfg = load_config(str(Path(a.paid) / CONFIG_FILE))
    dec = TokenText.load(resolve_model(cfg.model.name))
    with TrajectoryTree.open(Path(a.paid) / "store.sqlite") as tree:
        leaves = [t for t in tree.trajectories(tree.leaf_ids()) if t.status != "aborted"]
        kind = {
            t.leaf_id: ((tree.root_meta(t.root_id) or {}).get("task") or {})
            .get("metadata", {})
            .get("task_type")
            for t in leaves
        }
    unwon = [t for t in leaves if not t.info.get("won")]
    paid_leaves = [t for t in unwon if (t.partial_score or 0) > 0]
    print(
        f"# {a.paid}: {len(leaves)} RL episodes, {len(leaves) - len(unwon)} won, {len(unwon)} unwon, "
        f"{len(paid_leaves)} of those partially paid"
    )
    print(
        "partial scores of the paid:",
        dict(sorted(collections.Counter(round(t.partial_score, 2) for t in paid_leaves).items())),
    )
    print("by task type:", dict(collections.Counter(kind[t.leaf_id] for t in paid_leaves)))
    for t in random.Random(0).sample(paid_leaves, min(a.sample, len(paid_leaves))):
        kinds = ["policy" if m else "env" for m in t.policy_mask]
        turns = dec.turns(list(t.token_ids), kinds)
        goal = re.search(r"Your task is to: (.*)", turns[0]["text"])
        cmds = [re.sub(r"</?action>", "", x["text"]) for x in turns if x["kind"] == "policy"]
        print(
            f"\n[{kind[t.leaf_id]}] partial {t.partial_score:.2f}, {t.status}: "
            f"{goal.group(1) if goal else '?'}"
        )
        print("  " + " | ".join(cmds))


CREDIT_KINDS = ("go", "open", "take", "move", "use", "number-less")
"""Reply kinds ``--credit`` counts: a command's verb, or ``number-less`` for an object command without the
object's number (``take pen from dresser 1``)."""


def reply_kind(command: str) -> str:
    """The :data:`CREDIT_KINDS` entry of one reply (its verb when it is not listed there)."""
    if re.match(r"(take|move|clean|heat|cool|examine) \S+ (?!\d)", command + " "):
        return "number-less"
    words = command.split()
    return words[0] if words else ""


def credit(a: argparse.Namespace) -> None:
    """Which way the loss pushed each kind of reply (see the module docstring)."""
    import collections
    import sqlite3

    from fr_agents.config import load_config
    from fr_agents.ledger import batch_rows
    from fr_agents.models import resolve_model
    from fr_agents.run_layout import CONFIG_FILE, LEDGER_FILE, STORE_FILE
    from fr_agents.tree import TrajectoryTree
    from fr_agents.view.decode import TokenText

    run = Path(a.credit)
    cfg = load_config(str(run / CONFIG_FILE))
    dec = TokenText.load(resolve_model(cfg.model.name))
    side_counts = {"above": collections.Counter(), "below": collections.Counter()}
    rows_per_side = collections.Counter()
    push = collections.Counter()
    with closing(sqlite3.connect(run / LEDGER_FILE)) as con, TrajectoryTree.open(run / STORE_FILE) as tree:
        batches = [b for (b,) in con.execute("SELECT DISTINCT batch FROM episode_leaves ORDER BY batch")]
        for b in batches:
            rows = batch_rows(con, b)
            if len(rows) < cfg.trainer.batch_size:  # a batch the run did not finish
                continue
            trajs = tree.trajectories([r.leaf for r in rows])
            rewards = [t.learner_reward(cfg.rollout.reward) for t in trajs]
            mean = sum(rewards) / len(rewards)
            for t, r in zip(trajs, rewards, strict=True):
                kinds = ["policy" if m else "env" for m in t.policy_mask]
                replies = [
                    re.sub(r"</?action>", "", x["text"]).strip()
                    for x in dec.turns(list(t.token_ids), kinds)
                    if x["kind"] == "policy"
                ]
                side = "above" if r > mean else "below"
                rows_per_side[side] += 1
                c = collections.Counter(reply_kind(x) for x in replies)
                side_counts[side].update(c)
                for k, n in c.items():
                    push[k] += (r - mean) * n / len(replies)
    print(
        f"# {run}: {sum(rows_per_side.values())} RL rows of full batches, {rows_per_side['above']} above "
        f"their batch's mean reward, {rows_per_side['below']} at or below"
    )
    print(f"{'kind':<13}{'share above':>13}{'share below':>13}{'push':>9}")
    for k in CREDIT_KINDS:
        shares = [side_counts[s][k] / max(1, sum(side_counts[s].values())) for s in ("above", "below")]
        print(f"{k:<13}{shares[0]:>13.1%}{shares[1]:>13.1%}{push[k]:>+9.2f}")


def fork_report(a: argparse.Namespace) -> None:
    """Where a tree run's RL tokens went (see the module docstring)."""
    import collections
    import json

    from fr_agents.config import load_config
    from fr_agents.models import resolve_model
    from fr_agents.run_layout import CONFIG_FILE
    from fr_agents.tree import TrajectoryTree
    from fr_agents.view.decode import TokenText

    run = Path(a.forks)
    cfg = load_config(str(run / CONFIG_FILE))
    dec = TokenText.load(resolve_model(cfg.model.name))
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    steps = [r for r in rows if r.get("kind") == "step"]
    with TrajectoryTree.open(run / "store.sqlite") as tree:
        leaves = [t for t in tree.trajectories(tree.leaf_ids()) if t.status != "aborted"]
        children = {n: tree.children(n) for t in leaves for n in t.path}

    def action(ids: list[int]) -> str:
        turns = dec.turns(ids, ["policy"] * len(ids)) if ids else []
        text = turns[0]["text"] if turns else ""
        return re.sub(r"</?action>|\s+", " ", text).strip()

    # each fork: a node with more than one child; what each child's first reply said
    by_root: dict[int, list] = collections.defaultdict(list)
    for t in leaves:
        by_root[t.root_id].append(t)
    forks_seen, same_action, forks_total = set(), 0, 0
    spread_trees, equal_trees, leaves_per_tree = 0, 0, []
    for trajs in by_root.values():
        leaves_per_tree.append(len(trajs))
        rewards = {round(t.learner_reward(cfg.rollout.reward), 6) for t in trajs}
        equal_trees += len(rewards) == 1
        spread_trees += len(rewards) > 1
        for t in trajs:
            for node in t.path[:-1]:
                if len(children[node]) < 2 or node in forks_seen:
                    continue
                forks_seen.add(node)
                forks_total += 1
                firsts = set()
                for u in trajs:  # the first reply below each child, read off a leaf through it
                    if node in u.path and u.path.index(node) + 1 < len(u.path):
                        child = u.path[u.path.index(node) + 1]
                        mask = list(u.policy_mask)
                        start = u.offsets[u.path.index(node) + 1]
                        start = mask.index(True, start) if True in mask[start:] else len(mask)
                        end = mask.index(False, start) if False in mask[start:] else len(mask)
                        firsts.add((child, action(list(u.token_ids[start:end]))))
                texts = collections.Counter(text for _, text in firsts)
                same_action += len(texts) < len({c for c, _ in firsts})
    sampled = sum(r.get("sampled_tokens", 0) for r in steps)
    logical = sum(r.get("policy_tokens", 0) for r in steps)
    print(
        f"# {run}: {len(by_root)} trees, {len(leaves)} leaves ({statistics.mean(leaves_per_tree):.2f} a tree)"
    )
    print(
        f"forks (nodes with more than one child): {forks_total}; of those, where two children began with "
        f"the same command (the fork resampled the reply it forked on): {same_action} "
        f"({100 * same_action / max(forks_total, 1):.0f}%)"
    )
    print(
        f"trees whose leaves all scored the same (no credit from the tree): {equal_trees} of {len(by_root)}; "
        f"with a spread: {spread_trees}"
    )
    print(
        f"trained steps: {len(steps)}; rows merged as identical siblings: "
        f"{sum(r.get('merged', 0) for r in steps)}; "
        f"leaves pruned by J_max: {sum(r.get('pruned', 0) for r in steps)}"
    )
    print(
        f"policy tokens: sampled by the engine {sampled:,}, on the trained root-to-leaf paths {logical:,} "
        f"(each shared turn once per leaf through it)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--games", type=int, default=6, help="games to generate (valid_seen, one per task type)")
    ap.add_argument("--games-dir", default=None, help="use existing games instead of generating")
    ap.add_argument(
        "--seed",
        type=int,
        default=7,
        help="generation seed; --schedule: trainer.seed and tasks.seed (default 7; presets use 0)",
    )
    ap.add_argument(
        "--schedule", action="store_true", help="the engine pool on a training schedule (needs --games-dir)"
    )
    ap.add_argument("--demos", type=int, default=48, help="--schedule: train games kept for the warm start")
    ap.add_argument(
        "--batch", type=int, default=None, help="episodes a step (--schedule: default 8; --split: 16)"
    )
    ap.add_argument("--episodes", type=int, default=160, help="--schedule: episodes in all")
    ap.add_argument(
        "--capacity", type=int, nargs="+", default=[32, 128], help="--schedule: pool capacities to compare"
    )
    ap.add_argument(
        "--split", action="store_true", help="where an RL step's rollout time goes (needs --games-dir)"
    )
    ap.add_argument(
        "--preset", default="alfworld-smollm2", help="--split: the preset whose model and prompt play"
    )
    ap.add_argument("--run", default=None, help="--split: a run of the preset whose learner steps to report")
    ap.add_argument(
        "--paid", default=None, help="a run directory: what its unwon but partially paid RL episodes did"
    )
    ap.add_argument("--sample", type=int, default=12, help="--paid: episodes to print")
    ap.add_argument(
        "--credit", default=None, help="a run directory: which way its loss pushed each kind of command"
    )
    ap.add_argument(
        "--forks",
        default=None,
        help="a tree run's directory: its forks, those that repeated an action, its trees' reward spread",
    )
    ap.add_argument(
        "overrides", nargs="*", help="--split: config overrides, e.g. model.name=RUN/checkpoints/step_000010"
    )
    a = ap.parse_args()
    if a.paid:
        paid(a)
        return
    if a.forks:
        fork_report(a)
        return
    if a.credit:
        credit(a)
        return
    for flag, mode, batch in (("--split", split, 16), ("--schedule", schedule, 8)):
        if getattr(a, flag[2:]):
            if not a.games_dir:
                ap.error(f"{flag} needs --games-dir (a folder from `fr-agents alfworld generate`)")
            a.batch = a.batch or batch
            mode(a)
            return

    from envs.alfworld.env import ALFWorldEnv
    from envs.alfworld.generate import generate

    root = a.games_dir
    if root is None:
        root = tempfile.mkdtemp(prefix="alfworld-bench-")
        t0 = time.perf_counter()
        generate(root, {"valid_seen": a.games}, seed=a.seed, workers=1)
        gen = (time.perf_counter() - t0) / a.games
        print(f"generate: {gen:.2f} s/game (1 worker, {a.games} games)")

    env = ALFWorldEnv(split="valid_seen", games_dir=root, max_turns=200)
    resets, steps, forks = [], [], []
    for i in range(len(env.games)):
        t0 = time.perf_counter()
        env.reset(options={"game": i})
        resets.append(time.perf_counter() - t0)
        for cmd in env.walkthrough:
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(cmd)
            steps.append(time.perf_counter() - t0)
            if len(steps) % 7 == 0 and not (term or trunc):
                t0 = time.perf_counter()
                env.fork()
                forks.append(time.perf_counter() - t0)
            if term or trunc:
                break
    r, s = statistics.median(resets), statistics.median(steps)
    print(f"reset: median {r * 1000:.1f} ms over {len(resets)} games")
    print(f"step:  median {s * 1000:.2f} ms over {len(steps)} steps")
    if forks:
        f = statistics.median(forks)
        print(f"fork:  median {f * 1000:.1f} ms over {len(forks)} forks")
        print(f"ratio fork/reset: {f / r:.2f}")
    print(f"ratio step/reset: {s / r:.3f}")


if __name__ == "__main__":
    main()
