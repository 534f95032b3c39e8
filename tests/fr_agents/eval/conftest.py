"""Shared fixtures: the nano tiny model before and after a quick supervised fit on the arithmetic bench."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

BENCH_SIZE = 16


def _demos(tokenizer, bench):  # noqa: ANN001, ANN202 - test helper
    """Prompt tokens exactly as the rollout builds them, then the gold answer and the end-of-turn token."""
    import gymnasium

    env = gymnasium.make(bench.env_id, **bench.env_kwargs)
    demos = []
    for item in bench.items:
        obs, _ = env.reset(options=item.options)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": obs}], tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        answer = tokenizer.encode(item.options["task"]["answer"], add_special_tokens=False) + [
            tokenizer.eos_token_id
        ]
        demos.append((prompt, answer))
    env.close()
    return demos


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``before``: the untrained nano model; ``after``: it fitted (300 steps) on the first 16
    arithmetic answers."""
    from envs.benches import resolve_bench
    from fr_agents.models import load_policy, tiny_dir
    from trainer.warm_start import warm_start

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpts")
    before = root / "before"
    shutil.copytree(tiny_dir("nano"), before)
    model, tokenizer = load_policy(str(before))
    bench = resolve_bench("arithmetic", BENCH_SIZE)
    res = warm_start(
        model,
        _demos(tokenizer, bench),
        epochs=300,
        lr=1e-2,
        batch_size=BENCH_SIZE,
        pad_id=tokenizer.pad_token_id,
    )
    assert res.final_loss < 0.05, res
    after = root / "after"
    model.save_pretrained(after)
    tokenizer.save_pretrained(after)
    return {"before": before, "after": after}
