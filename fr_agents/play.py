"""``fr-agents play``: one episode in the terminal, played by a human, the env's expert or a model.

Each player prints the same transcript: ``[observation]``, the turn's action, ``[reward]``, and
a closing ``[result]`` line. The model's turns stream token by token as they are sampled.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


def play_human(env: object, seed: int, max_turns: int) -> int:
    obs, _ = env.reset(seed=seed)
    if not isinstance(obs, str):
        print(
            f"error: env {env.spec.id if env.spec else env} returned a {type(obs).__name__} observation",
            file=sys.stderr,
        )
        return 2
    total, interactive = 0.0, sys.stdin.isatty()
    print(f"[observation]\n{obs}")
    for turn in range(max_turns):
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            print("stdin ended before the episode did", file=sys.stderr)
            return 1
        action = line.rstrip("\n")
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        print(f"[action {turn}] {action}\n[reward] {float(reward)}")
        if not isinstance(obs, str):
            print(
                f"error: env {env.spec.id if env.spec else env} returned a {type(obs).__name__} observation",
                file=sys.stderr,
            )
            return 2
        if terminated or truncated:
            status = "finished" if terminated else "truncated"
            print(f"[result] {status}, total reward {total}, partial_score {info.get('partial_score')}")
            return 0
        print(f"[observation]\n{obs}")
    print(f"[result] truncated after {max_turns} turns, total reward {total}")
    return 0


def play_expert(env: object, seed: int, max_turns: int) -> int:
    """Play with the env's own expert (:func:`fr_agents.rollout.expert_actor`: its reply in the
    env's action format, e.g. ALFWorld's ``<action>cmd</action>``)."""
    from fr_agents.rollout import expert_actor, has_expert

    if not has_expert(env):
        print(f"error: {env} has no expert (expert_action())", file=sys.stderr)
        return 2
    obs, _ = env.reset(seed=seed)
    print(f"[observation]\n{obs}")
    info: dict = {}
    for turn in range(max_turns):
        reply = expert_actor(env)
        obs, reward, terminated, truncated, info = env.step(reply)
        print(f"[expert turn {turn}] {reply}\n[reward] {float(reward)}")
        if terminated or truncated:
            break
        print(f"[observation]\n{obs}")
    print(f"[result] won={info.get('won')}, partial_score {info.get('partial_score')}")
    return 0


def play_model(env: Any, make_env: Any, model: Any, tokenizer: Any, opts: Any, seed: int) -> int:
    """Play one episode with ``model``, streaming each turn to stdout as it is sampled."""
    from fr_agents.policy.hf import HFEngine
    from fr_agents.rollout import ObservationTypeError, run_episode
    from fr_agents.tree import TrajectoryTree

    stream: dict = {"turn": 0, "ids": [], "shown": ""}

    def on_token(token_id: int) -> None:
        """Stream the model's turn as it is sampled (called from the engine thread)."""
        if not stream["ids"]:
            print(f"[model turn {stream['turn']}] ", end="", flush=True)
        stream["ids"].append(token_id)
        text = tokenizer.decode(stream["ids"], skip_special_tokens=True)
        if text.startswith(stream["shown"]) and not text.endswith("\ufffd"):  # whole characters only
            print(text[len(stream["shown"]) :], end="", flush=True)
            stream["shown"] = text

    def show(kind: str, ev: dict) -> None:
        if kind == "prompt":
            print(f"[observation]\n{ev['observation']}", flush=True)
        elif kind == "action":
            final = tokenizer.decode(stream["ids"], skip_special_tokens=True)
            if stream["ids"] and final.startswith(stream["shown"]):
                print(final[len(stream["shown"]) :], flush=True)  # streamed already: finish the line
            else:
                print(("\n" if stream["ids"] else "") + f"[model turn {ev['turn']}] {ev['text']}", flush=True)
            stream.update(turn=ev["turn"] + 1, ids=[], shown="")
        elif kind == "observation":
            print(f"[reward] {ev['reward']}", flush=True)
            if not ev["done"]:
                print(f"[observation]\n{ev['text']}", flush=True)
        elif kind == "finish":
            print(
                f"[result] {ev['status']}, reward {ev['reward']}, partial_score {ev['partial_score']}",
                flush=True,
            )

    engine = HFEngine(model, tokenizer, on_token=on_token)
    try:
        asyncio.run(
            run_episode(
                env, engine, tokenizer, TrajectoryTree(), opts, seed=seed, make_env=make_env, on_event=show
            )
        )
    except ObservationTypeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        engine.close_sync()
    return 0
