"""``fr-agents view`` shows an ALFWorld episode as a transcript a person can read: the room and the
goal, each command and the engine's answer to it, in order, with the episode's reward and partial
score. The episode is real (ALFWorld's engine, its searching expert playing, cut by the turn limit);
it is stored turn by turn as the rollout stores one (policy tokens, then the engine's feedback as
environment tokens) and read back through the real server in headless Chromium."""

# ruff: noqa: F811 -- the viewer's pytest fixtures, imported from its conftest, are parameters here
from __future__ import annotations

import pytest

from envs.alfworld.env import ALFWorldEnv
from tests.fr_agents.view.conftest import browser, encode, page, screenshot, serving  # noqa: F401 (fixtures)
from tests.fr_agents.view.test_view_browser import MODEL, _fmt, _no_problems

pytestmark = pytest.mark.alfworld
TURNS = 4


def _play_into_store(games_root: str, path, encode) -> tuple[int, list[str], list[str], dict]:
    """One valid_unseen game, the expert's first TURNS commands; returns the leaf, the observations
    (the room first), the replies and the last info."""
    from fr_agents.tree import TrajectoryTree

    env = ALFWorldEnv(
        split="valid_unseen", games_dir=games_root, expert="search", max_turns=TURNS, list_admissible=False
    )
    try:
        obs, info = env.reset(options={"game": 1})
        observations, replies = [obs], []
        with TrajectoryTree.open(path) as t:
            node = t.add_root(encode(obs), meta={"env": "fr_agents/ALFWorld-v0", "seed": 0})
            for _ in range(TURNS):
                reply = env.expert_reply()
                ids = encode(reply)
                node = t.append(node, ids, [-0.1] * len(ids), True, 0)
                obs, reward, terminated, truncated, info = env.step(reply)
                replies.append(reply)
                if terminated or truncated:
                    break
                observations.append(obs)
                node = t.append(node, encode(obs), None, False, -1)
            leaf = t.finish(
                node,
                float(reward),
                partial_score=info["partial_score"],
                status="finished" if terminated else "truncated",
            )
    finally:
        env.close()
    return leaf, observations, replies, info


def test_an_alfworld_episode_reads_as_a_transcript(games_root, tmp_path, encode, page, serving, screenshot):
    leaf, observations, replies, info = _play_into_store(games_root, tmp_path / "alfworld.db", encode)
    assert not info["won"] and len(replies) == TURNS
    with serving(tmp_path / "alfworld.db", model=MODEL) as url:
        page.goto(url + "#trees")
        page.click("#roots tbody tr[data-root]")
        page.click(f"#tree .node[data-node='{leaf}'] .box")
        page.wait_for_selector(f"#detail[data-node='{leaf}'] #transcript")
        assert page.inner_text("#transcript-head") == (
            f"reward 0 · partial score {_fmt(info['partial_score'])} · {TURNS} replies"
        )
        turns = page.locator("#transcript .turn")
        kinds = [turns.nth(i).locator("b").inner_text() for i in range(turns.count())]
        texts = [turns.nth(i).locator("pre").inner_text() for i in range(turns.count())]
        # the room and the goal, then command and answer in turn
        assert kinds == ["env", "policy"] + ["env", "policy"] * (TURNS - 1)
        assert "You are in the middle of a room" in texts[0] and "Your task is to:" in texts[0]
        assert [x.strip() for x in texts[1::2]] == replies
        assert [x.strip() for x in texts[2::2]] == [o.strip() for o in observations[1:]]
        # one episode is a chain of turns: it reads as a list, no node indented under another
        assert page.locator("#tree .node .guide").count() == 0
        assert screenshot(page, "alfworld_transcript").exists()
        _no_problems(page)
