"""A short supervised warm start on labelled demos, reported apart from the RL lift.

A ~1M-parameter model starts at ~0% on 2-digit addition, and REINFORCE cannot learn from a batch in
which every reward is 0 (all advantages vanish). A few hundred labelled demos from the *train* split
(``warm_start.examples``) taught by plain next-token cross-entropy lift it to a low but non-zero
success rate; RL on the large unlabelled prompt pool takes it from there. Held-out success is
measured before and after the warm start and after RL, so each lift is reported separately.

A demo is exactly what a perfect rollout would produce, in one of two kinds (``warm_start.demos``):

* ``gold``: the prompt tokens as the rollout encodes them (no loss on them), then the gold answer's
  tokens and the end-of-turn token (with loss): a perfect first reply;
* ``expert``: a whole multi-turn episode played by the env's scripted expert (``expert_reply()``)
  through the real env, with :func:`fr_agents.rollout.run_episodes` as ``--agent expert`` plays it.
  The episodes are stored in ``RUN_DIR/demos.sqlite``, the expert's replies as non-policy demo spans
  (``info["demo_spans"]``); the loss is on those spans only, never on the prompt or on what the env
  answered. So the tool results a demo teaches the model to read are what the sandbox really
  printed: the demo is token-truthful, exactly the sequence a rollout that replied so would hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fr_agents.run_layout import DEMO_STORE

if TYPE_CHECKING:
    from fr_agents.config import TrainConfig
    from trainer.checkpoint import TrainerState
    from trainer.episodes import EpisodeRunner
    from trainer.metrics import MetricsSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpanDemo:
    """One demo as a whole token sequence and the ``[start, end)`` spans that carry the loss."""

    ids: list[int]
    spans: list[tuple[int, int]]


Demo = tuple[list[int], list[int]] | SpanDemo
"""A ``(prompt_ids, target_ids)`` pair (loss on the target) or a :class:`SpanDemo`."""


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


def _as_span_demo(demo: Demo) -> SpanDemo:
    if isinstance(demo, SpanDemo):
        return demo
    prompt, target = demo
    return SpanDemo(list(prompt) + list(target), [(len(prompt), len(prompt) + len(target))])


def _collate(demos: Sequence[Demo], pad_id: int) -> tuple[torch.Tensor, ...]:
    rows = [_as_span_demo(d) for d in demos]
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = torch.tensor(r.ids)
        attn[i, : len(r.ids)] = 1
        for start, end in r.spans:
            labels[i, start:end] = ids[i, start:end]
    return ids, attn, labels


def warm_start(
    model: torch.nn.Module,
    demos: Sequence[Demo],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    pad_id: int,
    seed: int = 0,
    max_minutes: float = 0.0,
    schedule: str = "constant",
    autocast: str = "",
) -> WarmStartResult:
    """Train ``model`` in place on ``demos`` with AdamW and token cross-entropy on their loss spans
    (a pair's target, a :class:`SpanDemo`'s spans).

    ``schedule``: ``constant`` keeps ``lr`` throughout; ``cosine`` warms up linearly over the first
    :data:`WARMUP_SHARE` of the steps, then decays to zero along a half cosine. Under a constant rate
    the weights at the last step are one draw from the noise of the last few updates, so which
    held-out problems they solve depends on float summation order (a thread count); a rate that
    decays to zero settles them.

    Its optimizer is private (discarded afterwards): the RL optimizer starts fresh, as it would
    from any pretrained checkpoint. ``autocast`` (``"bfloat16"``): the forward's products run in
    that dtype under ``torch.autocast``, as the learner's do (``trainer.autocast``); the loss,
    gradients and optimizer stay in the parameters' dtype.
    """
    if not demos:
        return WarmStartResult(0, 0, float("nan"), 0.0)
    started = time.perf_counter()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order = list(range(len(demos)))
    total = epochs * math.ceil(len(demos) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(schedule, step, total))
    model.train()
    steps, loss_value = 0, float("nan")
    deadline = started + max_minutes * 60 if max_minutes > 0 else float("inf")
    for epoch in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [demos[i] for i in order[start : start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = _demo_loss_backward(model, chunk, pad_id, device, autocast)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
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


SFT_CHUNK_TOKENS = 4096
"""A warm-start batch of more (padded) tokens than this is run a few demos at a time, with the
vocabulary projection only at the loss positions: whole ALFWorld episodes (8 x ~1,300 tokens) put
SmolLM2's 49k-way logits of every position in memory at once, ~20 GB in float32. A smaller batch
runs in one piece, exactly as before."""


def _demo_loss_backward(
    model: torch.nn.Module, chunk: Sequence[Demo], pad_id: int, device: torch.device, autocast: str
) -> torch.Tensor:
    """Backpropagate the mean token cross-entropy over the loss spans of ``chunk``; return it.

    At most :data:`SFT_CHUNK_TOKENS` padded tokens in one forward: a batch over that is split into
    groups of demos whose gradients add up to the whole batch's (each group's summed loss over the
    batch's count of loss tokens), the logits taken at the loss positions only."""
    cast = (
        (lambda: torch.autocast(device.type, dtype=getattr(torch, autocast)))
        if autocast
        else contextlib.nullcontext
    )
    ids, attn, labels = (t.to(device) for t in _collate(chunk, pad_id))
    if ids.numel() <= SFT_CHUNK_TOKENS:
        with cast():
            out = model(input_ids=ids, attention_mask=attn)
        logits = out.logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        loss.backward()
        return loss.detach()
    rows = [_as_span_demo(d) for d in chunk]
    count = sum(
        e - s - (1 if s == 0 else 0) for r in rows for s, e in r.spans
    )  # targets have a token before them
    total = torch.zeros((), device=device)
    groups: list[list[Demo]] = [[]]
    for demo, row in zip(chunk, rows, strict=True):
        widest = max([len(row.ids)] + [len(_as_span_demo(d).ids) for d in groups[-1]])
        if groups[-1] and widest * (len(groups[-1]) + 1) > SFT_CHUNK_TOKENS:
            groups.append([])
        groups[-1].append(demo)
    for group in groups:
        ids, attn, labels = (t.to(device) for t in _collate(group, pad_id))
        targets = labels[:, 1:]
        where = targets != -100
        with cast():
            hidden = model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
            logits = model.get_output_embeddings()(hidden[where])
        part = torch.nn.functional.cross_entropy(logits.float(), targets[where], reduction="sum") / count
        part.backward()
        total += part.detach()
    return total


WARMUP_SHARE = 0.05
"""The share of the warm start's steps over which ``schedule=cosine`` warms its rate up."""


def lr_factor(schedule: str, step: int, total: int) -> float:
    """The learning-rate multiplier at ``step`` of ``total`` (see :func:`warm_start`; the
    schedules are ``fr_agents.config.WARM_START_SCHEDULES``)."""
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"warm_start.schedule: unknown schedule {schedule!r} (constant or cosine)")
    warmup = max(1, round(WARMUP_SHARE * total))
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))


def expert_demos(
    cfg: TrainConfig, runner: EpisodeRunner, demo_tasks: Sequence[dict[str, Any]], store: str | Path
) -> list[SpanDemo]:
    """Play ``demo_tasks`` with the env's scripted expert through the real env (``runner.make_env``,
    the rollout's options and chat template) into the store at ``store``; one :class:`SpanDemo` per
    episode the expert won, its loss spans the leaf's ``demo_spans``.

    Raises :class:`~fr_agents.config.ConfigError` naming ``rollout.max_new_tokens`` when an expert
    reply is longer than the policy may sample (it could never reproduce the demo).
    """
    from fr_agents.config import ConfigError
    from fr_agents.rollout import expert_actor, reset_args, run_episodes_sync
    from fr_agents.tree import TrajectoryTree

    seeds, tasks = [], []
    for i, task in enumerate(demo_tasks):
        seed, option = reset_args(task, cfg.trainer.seed + i)
        seeds.append(seed)
        tasks.append(option)
    # one path per demo: the expert plays each task once, whatever rollout.branch_factor and the
    # tree budget say of RL episodes (forked copies of a scripted episode would multiply the demos)
    once = dataclasses.replace(runner.options, branch_factor=1, branch_at=(), tree_budget_tokens=0)
    with TrajectoryTree.open(store) as tree:
        results = run_episodes_sync(
            runner.make_env,
            None,
            runner.tokenizer,
            tree,
            len(tasks),
            once,
            concurrency=max(1, cfg.rollout.concurrency),
            seeds=seeds,
            tasks=tasks,
            actor=expert_actor,
        )
        won = [
            leaf.leaf_id for r in results for leaf in r.leaves if leaf.reward > 0 and leaf.status != "aborted"
        ]
        trajectories = tree.trajectories(won)
    demos = [
        SpanDemo(list(t.token_ids), [(int(a), int(b)) for a, b in t.info.get("demo_spans", [])])
        for t in trajectories
    ]
    longest = max((b - a for d in demos for a, b in d.spans), default=0)
    if longest > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"rollout.max_new_tokens: an expert reply is {longest} tokens (end of turn included), "
            f"the policy may sample only {cfg.rollout.max_new_tokens}; raise it to at least {longest}"
        )
    log.info(
        "warm start: the expert won %d of %d demo episodes (stored in %s)", len(demos), len(tasks), store
    )
    return demos


def run_warm_start(
    cfg: TrainConfig,
    model: torch.nn.Module,
    runner: EpisodeRunner,
    demo_tasks: Sequence[dict[str, Any]],
    metrics: MetricsSink,
    state: TrainerState,
    run_dir: str | Path | None = None,
) -> None:
    """The run's warm start (``warm_start.*``): SFT on demos of ``demo_tasks`` (``warm_start.demos``:
    gold answers after the prompts as the rollout encodes them, or whole episodes of the env's
    expert stored in ``run_dir/demos.sqlite``), recorded in ``state.warm_start`` and as a
    ``warm_start`` event."""
    ws = cfg.warm_start
    collect_started = time.perf_counter()
    if ws.demos == "expert":
        if run_dir is None:
            raise ValueError("run_dir: expert demos are stored in the run directory")
        demos: list[Demo] = list(expert_demos(cfg, runner, demo_tasks, Path(run_dir) / DEMO_STORE))
    else:
        demos = list(
            build_demos(demo_tasks, encode_prompt=runner.encode_task, encode_answer=runner.encode_answer)
        )
    collect_s = time.perf_counter() - collect_started
    res = warm_start(
        model,
        demos,
        epochs=ws.epochs,
        lr=ws.lr,
        batch_size=ws.batch_size,
        pad_id=runner.pad_id,
        seed=cfg.trainer.seed,
        max_minutes=ws.max_minutes,
        schedule=ws.schedule,
        autocast=cfg.learner_autocast,
    )
    model.train()
    threads = torch.get_num_threads()
    state.warm_start["result"] = {
        "examples": res.examples,
        "steps": res.steps,
        "loss": res.final_loss,
        "seconds": res.seconds,
        "demos": ws.demos,
        "collect_seconds": collect_s,
        "threads": threads,
    }
    metrics.event(
        "warm_start",
        examples=res.examples,
        steps=res.steps,
        loss=res.final_loss,
        seconds=res.seconds,
        demos=ws.demos,
        collect_seconds=collect_s,
        threads=threads,
    )


def warm_start_score(cfg: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    """The warm start of ``cfg`` alone, then its greedy held-out figures: what ``fr-agents train``
    does before RL, without the evaluation of the untrained model, the rollout engine or RL.

    Returns the held-out figures (``success``, ``episodes``, ...) with the warm start's ``steps``,
    ``loss``, ``seconds`` and ``threads``. ``benchmarks/warm_start.py`` compares recipes with it,
    and a test holds the default preset's warm start above a floor.
    """
    from trainer.checkpoint import TrainerState
    from trainer.os_tuning import release_freed_memory, warm_start_cores
    from trainer.parts import build_learner_side, build_rollout_side

    if cfg.warm_start.examples <= 0:
        raise ValueError("warm_start.examples: 0 means no warm start; nothing to score")
    if cfg.trainer.eval_episodes <= 0:
        raise ValueError("trainer.eval_episodes: 0 means no held-out evaluation; nothing to score with")
    learner_side = build_learner_side(cfg, run_dir, console=False)
    rollout_side = build_rollout_side(cfg, run_dir, tokenizer=learner_side.tokenizer, with_engine=False)
    state = TrainerState()
    try:
        with warm_start_cores():
            run_warm_start(
                cfg,
                learner_side.model,
                rollout_side.runner,
                rollout_side.demo_tasks,
                learner_side.metrics,
                state,
                run_dir,
            )
        release_freed_memory()  # as fr-agents train does before its evaluation
        figures = learner_side.held_out.run("after_warm_start", 0, learner_side.model, learner_side.tokenizer)
    finally:
        rollout_side.close()
        learner_side.metrics.close()
    return {**figures, **{k: state.warm_start["result"][k] for k in ("steps", "loss", "seconds", "threads")}}
