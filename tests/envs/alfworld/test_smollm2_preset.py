"""The alfworld-smollm2 preset: what SmolLM2 sees at turn 0 and turn 3, where the warm start's loss
falls on an ALFWorld demo, the error short of games, and one real RL step on a generated game."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fr_agents.config import ConfigError, load_config
from trainer.parts import build_rollout_side
from trainer.preflight import run_preflight
from trainer.warm_start import DEMO_STORE, _collate, expert_demos

PRESET = "alfworld-smollm2"


def overrides(games_root: str, *more: str) -> list[str]:
    """The preset on the tests' small set: its valid_seen games stand in for train games."""
    return [f"tasks.params={{games_dir: {games_root}}}", "tasks.train_split=valid_seen", *more]


def one_rl_step(games_root: str, *more: str, leaves: int) -> list[str]:
    """The preset reduced to one optimizer step on one generated game of 2 turns: ``leaves``
    trajectories a batch, no evaluation, no checkpoint, the rollout in the learner's process."""
    return overrides(
        games_root,
        "tasks.params.limit=1",
        "warm_start.examples=0",
        f"trainer.batch_size={leaves}",
        f"rollout.concurrency={leaves}",
        "trainer.steps=1",
        "trainer.max_minutes=0",
        "trainer.eval_episodes=0",
        "trainer.eval_every=0",
        "trainer.backend=local",
        "trainer.threads=1",
        "env.max_turns=2",
        "trainer.checkpoint_every=0",
        *more,
    )


@pytest.fixture(scope="module")
def demos(games_root: str, tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(PRESET, overrides(games_root, "warm_start.examples=2", "rollout.concurrency=2"))
    side = build_rollout_side(cfg, run, with_engine=False)
    made = expert_demos(cfg, side.runner, side.demo_tasks, run / DEMO_STORE)
    yield cfg, side, made, run
    side.close()


def text(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_what_the_model_sees_at_turn_0_and_turn_3(demos) -> None:
    """Turn 0: SmolLM2's chat template with the preset's system message (the command vocabulary)
    and the room and goal, no admissible list. Turn 3: the same conversation with the three replies
    as assistant turns and the engine's feedback as user turns, ending in the generation prompt."""
    cfg, side, made, _ = demos
    tok = side.tokenizer
    demo = next(d for d in made if len(d.spans) >= 4)
    turn0 = text(tok, demo.ids[: demo.spans[0][0]])
    assert turn0.startswith(f"<|im_start|>system\n{cfg.env.system_prompt}<|im_end|>\n<|im_start|>user\n")
    assert "-= Welcome to TextWorld, ALFRED! =-" in turn0 and "Your task is to: " in turn0
    assert "Admissible commands" not in turn0
    assert turn0.endswith(
        "Reply with one command inside <action>...</action>.<|im_end|>\n<|im_start|>assistant\n"
    )

    turn3 = text(tok, demo.ids[: demo.spans[3][0]])
    replies = [text(tok, demo.ids[s:e]) for s, e in demo.spans[:3]]
    assert all(r.startswith("<action>") and r.endswith("</action><|im_end|>") for r in replies)
    messages = [{"role": "system", "content": cfg.env.system_prompt}]
    rest = turn3[len(turn0) :]
    first_obs = turn0.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0]
    messages.append({"role": "user", "content": first_obs})
    for r in replies:  # each reply, then the engine's answer to it
        messages.append({"role": "assistant", "content": r.removesuffix("<|im_end|>")})
        rest = rest.split(r, 1)[1]
        feedback = rest.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        messages.append({"role": "user", "content": feedback})
        assert "Admissible commands" not in feedback and "Reply with one command" not in feedback
    assert turn3 == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_the_warm_start_loss_falls_on_the_expert_commands_only(demos) -> None:
    _, side, made, _ = demos
    ids, attn, labels = _collate(made, side.runner.pad_id)
    for i, demo in enumerate(made):
        on = {j for s, e in demo.spans for j in range(s, e)}
        assert [j for j in range(labels.shape[1]) if labels[i, j] != -100] == sorted(on)
        assert int(attn[i].sum()) == len(demo.ids)
        for s, e in demo.spans:  # a span is one command and the end of the turn: nothing the env wrote
            reply = text(side.tokenizer, demo.ids[s:e])
            assert reply.startswith("<action>") and reply.endswith("</action><|im_end|>")
            assert "\n" not in reply


def test_a_run_short_of_games_stops_before_any_work_with_the_command(tmp_path: Path) -> None:
    games = tmp_path / "games"
    cfg = load_config(PRESET, [f"tasks.params.games_dir={games}"])
    pf = run_preflight(cfg, import_env=False)
    want = f"fr-agents alfworld generate --out {games} --n 200 --seen 0 --unseen 134 --seed 0"
    assert not pf.ok and any(want in c.detail for c in pf.checks if not c.ok)
    with pytest.raises(ConfigError, match="train: 0 of 200, valid_unseen: 0 of 134"):
        pf.raise_if_failed()
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fr_agents.cli",
            "train",
            PRESET,
            f"tasks.params.games_dir={games}",
            "--run-dir",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and want in done.stderr + done.stdout
    assert not (run / "store.sqlite").exists()


@pytest.mark.slow
def test_one_real_smollm2_rl_step_on_a_generated_game(games_root: str, tmp_path: Path) -> None:
    """The preset's RL on SmolLM2 itself: two episodes of one generated game, one optimizer step."""
    from trainer.loop import Trainer

    cfg = load_config(PRESET, one_rl_step(games_root, leaves=2))
    res = Trainer(cfg, tmp_path, console=False).run()
    assert res.ok and res.steps == 1
    from fr_agents.tree import TrajectoryTree

    with TrajectoryTree.open(tmp_path / "store.sqlite") as tree:
        leaves = tree.trajectories(tree.leaf_ids())
    assert len(leaves) == 2 and all(any(t.policy_mask) for t in leaves)
    assert all(0.0 <= t.reward <= 1.0 and "won" in t.info for t in leaves)


def test_the_tree_preset_is_alfworld_smollm2_with_turn_forks_and_node_credit(capsys, tmp_path: Path) -> None:
    """alfworld-smollm2-tree changes only how RL samples and credits (forks before turns 0 and 3, J_max
    4, the nodes baseline); the games, prompt, warm start, evaluations and budget are the base's, and
    the dry run says what the tree does."""
    from fr_agents.cli import main
    from fr_agents.config_io import to_dict

    base, tree = to_dict(load_config(PRESET)), to_dict(load_config("alfworld-smollm2-tree"))
    changed = {
        ("rollout", "branch_factor"): 2,
        ("rollout", "branch_at"): [0, 3],
        ("trainer", "max_per_root"): 4,
        ("objective", "baseline"): "nodes",
    }
    for (section, key), value in changed.items():
        assert tree[section][key] == value and base[section][key] != value, (section, key)
        tree[section][key] = base[section][key]
    for key in ("preset", "description"):
        assert tree.pop(key) != base.pop(key)
    assert tree == base
    assert main(["train", "alfworld-smollm2-tree", "--dry-run", f"run.out_dir={tmp_path}"]) in (0, 2)
    plan = capsys.readouterr().out.split("# placement plan")[1]
    assert "trees of up to 4 leaves: 2 continuations before the reply of turn(s) 0, 3" in plan
    assert "a batch of 16 leaves schedules 4 episode(s)" in plan
    assert "at most 4 leaves of each tree trained" in plan
    assert "credit: objective.baseline=nodes: per token, the value of the tree node" in plan


@pytest.mark.slow
def test_one_real_smollm2_tree_rl_step_forks_an_alfworld_game(games_root: str, tmp_path: Path) -> None:
    """The tree preset's RL on SmolLM2 itself: one generated game forked before turns 0 and 1 (four
    leaves through ALFWorld's engine), one optimizer step with the nodes baseline; the leaves share
    the prompt, and siblings of the turn-1 fork also share their first command and its feedback."""
    from fr_agents.tree import TrajectoryTree
    from trainer.loop import Trainer

    cfg = load_config("alfworld-smollm2-tree", one_rl_step(games_root, "rollout.branch_at=[0,1]", leaves=4))
    res = Trainer(cfg, tmp_path, console=False).run()
    assert res.ok and res.steps == 1
    with TrajectoryTree.open(tmp_path / "store.sqlite") as tree:
        (root,) = tree.roots()
        leaves = tree.trajectories(tree.leaf_ids())
    assert len(leaves) >= 2 and all(t.root_id == root and any(t.policy_mask) for t in leaves)
    assert all(0.0 <= t.reward <= 1.0 and "won" in t.info for t in leaves)
    first = leaves[0].prompt_len  # the room, the goal and the chat template's opening
    assert all(t.token_ids[:first] == leaves[0].token_ids[:first] for t in leaves)
    longest = max(
        len(os.path.commonprefix([a.token_ids, b.token_ids])) for a in leaves for b in leaves if a is not b
    )
    assert longest > first + 1, "siblings of the turn-1 fork share their first turn"
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("step") == 1 for m in metrics)


def test_eval_of_a_run_plays_the_alfworld_bench_as_the_run_did(games_root: str, tmp_path: Path) -> None:
    """`fr-agents eval RUN --bench alfworld-unseen`: the run's games folder, prompt, env kwargs and
    limits, the same games training's held-out evaluation plays; without a run, the plain bench."""
    from envs.benches import eval_bench_for, resolve_bench
    from fr_agents.cli import _run_config
    from fr_agents.config_io import dump_config

    cfg = load_config(PRESET, overrides(games_root))
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000010").mkdir(parents=True)
    dump_config(cfg, run / "config.yaml")
    for arg in (str(run), str(run / "checkpoints" / "step_000010")):
        assert _run_config([arg]) == run / "config.yaml"
    bench = resolve_bench("alfworld-unseen", run_config=_run_config([str(run)]))
    trained = eval_bench_for(cfg).subset(cfg.trainer.eval_episodes, cfg.tasks.seed)
    assert sorted(i.id for i in bench.items) == sorted(i.id for i in trained.items)
    assert all(i.options["task"]["metadata"]["game"].startswith(games_root) for i in bench.items)
    for field in ("env_id", "env_kwargs", "max_turns", "max_new_tokens", "max_context", "system_prompt"):
        assert getattr(bench, field) == getattr(trained, field), field
    assert bench.env_kwargs["list_admissible"] is False and bench.system_prompt == cfg.env.system_prompt
    seen = resolve_bench("alfworld-seen", run_config=run / "config.yaml")
    assert {i.group for i in seen.items} and all(
        "valid_seen" in i.options["task"]["metadata"]["game"] for i in seen.items
    )
    other = tmp_path / "other"
    other.mkdir()
    dump_config(load_config(PRESET, overrides(games_root, "env.max_turns=5")), other / "config.yaml")
    with pytest.raises(ConfigError, match="played their benches differently"):
        _run_config([str(run), str(other)])


def test_the_viewer_shows_an_episode_as_a_transcript(demos) -> None:
    """`fr-agents view` on an ALFWorld store: a leaf's whole episode as turns to read, the room and
    goal first, then each command and the engine's answer, without the chat template's markers."""
    from fr_agents.models import resolve_model
    from fr_agents.tree import TrajectoryTree
    from fr_agents.view.decode import TokenText
    from fr_agents.view.reader import StoreReader

    cfg, _, _, run = demos
    store = run / DEMO_STORE
    dec = TokenText.load(resolve_model(cfg.model.name))
    with TrajectoryTree.open(store) as tree:
        leaf = max(tree.leaf_ids(), key=lambda i: len(tree.trajectory(i).token_ids))
    turns = StoreReader(store).node(leaf, dec)["transcript"]
    assert turns[0]["kind"] == "env" and turns[0]["text"].startswith(cfg.env.system_prompt)
    assert "Your task is to: " in turns[0]["text"] and "<|im_start|>" not in turns[0]["text"]
    assert [t["kind"] for t in turns[1:]] == ["demo", "env"] * ((len(turns) - 1) // 2) + ["demo"] * (
        (len(turns) - 1) % 2
    )
    replies = [t["text"] for t in turns if t["kind"] == "demo"]
    assert all(re.fullmatch(r"<action>[a-z0-9 /]+</action>", r) for r in replies), replies
    assert not any(t["text"].splitlines()[0] in ("user", "assistant") for t in turns)
