"""Held-out success of a single-turn policy: greedy decoding, scored by the env itself.

For every task of the held-out split the env is reset with that task, its first observation is
encoded exactly as the rollout encodes it (``encode``), the model completes it greedily (batched,
left-padded), and the completion text is passed to ``env.step``: success is ``info['won']``
(``reward > 0`` when the env does not say; the mean reward is reported too). The env class that
scores training episodes scores evaluation, so the two never disagree on what counts as correct.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    success: float  # share of tasks won (info['won'], else reward > 0)
    reward: float  # mean reward
    episodes: int
    seconds: float
    samples: list[tuple[str, str, float]]  # a few (observation, completion, reward) for the log

    def as_dict(self) -> dict[str, float]:
        return {"success": self.success, "reward": self.reward, "episodes": self.episodes, "seconds": self.seconds}


@torch.no_grad()
def greedy_complete(
    model: Any, prompts: Sequence[list[int]], *, max_new_tokens: int, eos_ids: Sequence[int], pad_id: int
) -> list[list[int]]:
    """Greedy continuations (each cut at its first eos, eos excluded) of left-padded prompts."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
    )
    eos = set(eos_ids)
    result = []
    for row in out[:, width:].tolist():
        cut = next((j for j, t in enumerate(row) if t in eos), len(row))
        result.append(row[:cut])
    return result


def evaluate_single_turn(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[dict[str, Any]],
    *,
    make_env: Callable[[], Any],
    encode: Callable[[str], list[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    batch_size: int = 64,
) -> EvalResult:
    """Greedy held-out success on ``tasks`` (see the module docstring)."""
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    env = make_env()
    rewards: list[float] = []
    wins: list[bool] = []
    samples: list[tuple[str, str, float]] = []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    try:
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start : start + batch_size]
            observations = []
            for task in chunk:
                obs, _info = env.reset(options={"task": dict(task)})
                observations.append(obs)
            completions = greedy_complete(
                model,
                [encode(o) for o in observations],
                max_new_tokens=max_new_tokens,
                eos_ids=eos_ids,
                pad_id=pad_id,
            )
            for task, obs, comp in zip(chunk, observations, completions, strict=True):
                env.reset(options={"task": dict(task)})
                text = tokenizer.decode(comp, skip_special_tokens=True)
                _obs, reward, _term, _trunc, info = env.step(text)
                rewards.append(float(reward))
                wins.append(bool(info.get("won", float(reward) > 0)))
                if len(samples) < 5:
                    samples.append((obs, text, float(reward)))
    finally:
        env.close()
        model.train(was_training)
    n = len(rewards)
    return EvalResult(
        success=sum(wins) / max(1, n),
        reward=sum(rewards) / max(1, n),
        episodes=n,
        seconds=time.perf_counter() - started,
        samples=samples,
    )
