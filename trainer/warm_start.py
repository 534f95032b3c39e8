"""A short supervised warm start on labelled demos, reported apart from the RL lift.

A ~1M-parameter model starts at ~0% on 2-digit addition, and REINFORCE cannot learn from a batch in
which every reward is 0 (all advantages vanish). A few hundred labelled demos from the *train* split
(``warm_start.examples``) taught by plain next-token cross-entropy lift it to a low but non-zero
success rate; RL on the large unlabelled prompt pool takes it from there. Held-out success is
measured before and after the warm start and after RL, so each lift is reported separately.

A demo is exactly what a perfect rollout would produce: the prompt tokens as the rollout encodes
them (no loss on them), then the answer tokens and the end-of-turn token (with loss).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass
class WarmStartResult:
    examples: int
    steps: int
    final_loss: float
    seconds: float


def build_demos(
    tasks: Sequence[dict[str, Any]],
    *,
    encode_prompt: Callable[[dict[str, Any]], list[int]],
    encode_answer: Callable[[dict[str, Any]], list[int]],
) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, target_ids)`` pairs; ``target_ids`` ends with the end-of-turn token."""
    return [(encode_prompt(t), encode_answer(t)) for t in tasks]


def _collate(demos: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(p) + len(a) for p, a in demos)
    ids = torch.full((len(demos), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(demos), width), dtype=torch.long)
    labels = torch.full((len(demos), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(demos):
        row = p + a
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        labels[i, len(p) : len(row)] = torch.tensor(a)
    return ids, attn, labels


def warm_start(
    model: Any,
    demos: Sequence[tuple[list[int], list[int]]],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    pad_id: int,
    seed: int = 0,
    max_minutes: float = 0.0,
) -> WarmStartResult:
    """Train ``model`` in place on ``demos`` with AdamW and token cross-entropy on the answers.

    Its optimizer is private (discarded afterwards): the RL optimizer starts fresh, as it would
    from any pretrained checkpoint.
    """
    if not demos:
        return WarmStartResult(0, 0, float("nan"), 0.0)
    started = time.perf_counter()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order = list(range(len(demos)))
    model.train()
    steps, loss_value = 0, float("nan")
    deadline = started + max_minutes * 60 if max_minutes > 0 else float("inf")
    for epoch in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [demos[i] for i in order[start : start + batch_size]]
            ids, attn, labels = (t.to(device) for t in _collate(chunk, pad_id))
            out = model(input_ids=ids, attention_mask=attn)
            logits = out.logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
            loss_value = float(loss.detach())
            if time.perf_counter() > deadline:
                log.info("warm start: time budget reached in epoch %d", epoch + 1)
                break
        else:
            log.info("warm start: epoch %d/%d loss %.4f", epoch + 1, epochs, loss_value)
            continue
        break
    model.eval()
    return WarmStartResult(len(demos), steps, loss_value, time.perf_counter() - started)


def run_warm_start(cfg: Any, model: Any, runner: Any, demo_tasks: Sequence[dict[str, Any]], metrics: Any, state: Any) -> None:
    """The run's warm start (``warm_start.*``): SFT on ``demo_tasks`` (prompts as the rollout
    encodes them, gold answers), recorded in ``state.warm_start`` and as a ``warm_start`` event."""
    ws = cfg.warm_start
    demos = build_demos(demo_tasks, encode_prompt=runner.encode_task, encode_answer=runner.encode_answer)
    res = warm_start(
        model,
        demos,
        epochs=ws.epochs,
        lr=ws.lr,
        batch_size=ws.batch_size,
        pad_id=runner.pad_id,
        seed=cfg.trainer.seed,
        max_minutes=ws.max_minutes,
    )
    model.train()
    state.warm_start["result"] = {"examples": res.examples, "steps": res.steps, "loss": res.final_loss, "seconds": res.seconds}
    metrics.event("warm_start", examples=res.examples, steps=res.steps, loss=res.final_loss, seconds=res.seconds)
