"""What the real-model preset (math-smollm2) needs beyond the tiny one: example turns before the
first observation (``env.examples``), a learner whose forward runs in bfloat16 (``trainer.autocast``),
and the preset itself, one real RL step of SmolLM2-135M in seconds."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fr_agents.config import ConfigError, config_from_dict, load_config
from fr_agents.tree.batch import build_flat
from tests.trainer.learners import make_learner
from tests.trainer.test_learner import make_trajectories, tiny_model
from trainer.learner import Learner

EXAMPLES = [
    {"role": "user", "content": "What is 23 + 19?"},
    {"role": "assistant", "content": "23 + 19 = 42. The answer is \\boxed{42}."},
]


def test_example_turns_sit_between_the_system_message_and_the_first_observation_everywhere(tmp_path) -> None:
    """env.examples reach the training rollout's prompt, the warm start's encoder and the held-out
    bench (and its resume fingerprint) in the same place: after the system message, before the
    question, in the model's chat template."""
    from envs.benches import bench_from_config
    from fr_agents.eval.runner import EvalSettings, fingerprint, rollout_options
    from fr_agents.models import load_tokenizer
    from fr_agents.rollout import encode_prompt, example_turns, prompt_messages
    from trainer.episodes import EpisodeRunner

    turns = example_turns(EXAMPLES)
    assert prompt_messages("What is 57 + 29?", "Be brief.", turns) == [
        {"role": "system", "content": "Be brief."},
        *EXAMPLES,
        {"role": "user", "content": "What is 57 + 29?"},
    ]
    tok = load_tokenizer("tiny")
    text, ids = encode_prompt(tok, "What is 57 + 29?", "Be brief.", turns)
    assert (
        text.index("Be brief.")
        < text.index("What is 23 + 19?")
        < text.index("\\boxed{42}")
        < text.index("57 + 29")
    )
    assert ids == tok.encode(text, add_special_tokens=False)

    cfg = config_from_dict(
        {
            "env": {"system_prompt": "Be brief.", "examples": EXAMPLES},
            "tasks": {"params": {"template": "What is {a} + {b}?"}},
            "warm_start": {"examples": 0},
        }
    )
    runner = EpisodeRunner(cfg, "tiny", tok, None, None, [], with_engine=False)
    assert runner.options.examples == turns
    assert runner.encode_observation("What is 57 + 29?") == ids

    bench = bench_from_config(cfg)
    assert bench.examples == turns
    settings = EvalSettings(k=1, temperature=0.0)
    assert rollout_options(bench, settings).examples == turns
    assert json.loads(json.dumps(fingerprint(bench, settings)))["examples"] == [list(t) for t in turns]
    # without examples the fingerprint is what it was, so results stored before still resume
    assert "examples" not in fingerprint(bench_from_config(config_from_dict({})), settings)


@pytest.mark.parametrize("bad", [{"role": "system", "content": "x"}, {"role": "user"}, "hello"])
def test_a_malformed_example_turn_is_refused_naming_the_key(bad) -> None:
    with pytest.raises(ConfigError, match=r"env\.examples(: turn |\[)0"):
        config_from_dict({"env": {"examples": [bad]}})


def test_a_bfloat16_autocast_step_keeps_float32_weights_and_follows_the_float32_gradient() -> None:
    """trainer.autocast=bfloat16: the step's forward runs in bfloat16 (its recomputed log-probs
    carry bfloat16 rounding), the parameters, gradients and Adam's state stay float32, and the
    update points where the float32 step's does."""
    base = tiny_model().to(torch.float32)
    trajs = make_trajectories(base)
    grads = {}
    stats = {}
    for autocast in ("", "bfloat16"):
        model = tiny_model().to(torch.float32)
        learner = make_learner(
            model, torch.optim.SGD(model.parameters(), lr=0.0), delta=0.5, autocast=autocast
        )
        seen = []
        learner.optimizer.register_step_pre_hook(
            lambda opt, *_, seen=seen: seen.append(
                torch.cat([p.grad.flatten() for p in opt.param_groups[0]["params"]])
            )
        )
        stats[autocast] = learner.step(build_flat(trajs))
        grads[autocast] = seen[0]
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert grads["bfloat16"].dtype == torch.float32
    cosine = float(torch.nn.functional.cosine_similarity(grads[""], grads["bfloat16"], dim=0))
    assert cosine > 0.95, cosine
    assert all(math.isfinite(stats[a]["loss"]) for a in stats)
    # the forward's products run in bfloat16 inside the learner's context, in float32 without it
    from fr_agents.models.forward import policy_token_logits

    flat = build_flat(trajs)
    ids, attn, act = flat.token_ids, flat.attention_mask, flat.action_mask
    for autocast, dtype in (("", torch.float32), ("bfloat16", torch.bfloat16)):
        learner = make_learner(tiny_model().to(torch.float32), autocast=autocast)
        assert learner.policy.compact_reason is None
        with learner.policy.autocast_context(torch.device("cpu")):
            _, _, logits = policy_token_logits(learner.model, ids, attn, act)
        assert logits.dtype == dtype
    with pytest.raises(ValueError, match="autocast"):
        make_learner(tiny_model().to(torch.float32), autocast="float16")
    assert (
        Learner.from_config(
            tiny_model().to(torch.float32), config_from_dict({"trainer": {"autocast": "bfloat16"}})
        ).policy.config.autocast
        == "bfloat16"
    )


def test_math_smollm2_takes_a_real_rl_step_of_smollm2_in_seconds(tmp_path) -> None:
    """The preset as shipped (its prompt, its engine and learner dtypes resolved for this CPU), cut
    to two episodes of eight tokens: SmolLM2-135M samples, is graded, and the learner steps its
    float32 weights; the dry-run plan names every part."""
    from fr_agents.models.precision import bfloat16_support
    from trainer.loop import main_train
    from trainer.preflight import dry_run_report

    overrides = [
        "trainer.steps=1",
        "trainer.max_minutes=0",
        "trainer.batch_size=2",
        "rollout.concurrency=2",
        "rollout.max_new_tokens=8",
        "trainer.eval_episodes=2",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=1000",
        "trainer.plot_every=1000",
        f"run.out_dir={tmp_path}",
        "run.name=r",
    ]
    cfg = load_config("math-smollm2", overrides)
    assert cfg.model.tuned_for == "pretrained" and (cfg.rollout.dtype, cfg.trainer.autocast) == (
        "auto",
        "auto",
    )
    fast = bfloat16_support("cpu")[0]
    assert (cfg.engine_dtype, cfg.learner_autocast) == (("bfloat16", "bfloat16") if fast else ("float32", ""))
    report = dry_run_report(cfg)
    assert "WARNING" not in report
    assert (
        f"precision: the rollout engine and the evaluations sample in {cfg.engine_dtype} (rollout.dtype=auto"
        in report
    )
    assert ("autocast: the learner's forward runs its products in bfloat16" in report) == fast
    assert "prompt: 2 example turn(s)" in report
    assert main_train("math-smollm2", overrides) == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") == "step"]
    assert len(steps) == 1 and steps[0]["samples"] == 2 and math.isfinite(steps[0]["loss"])
    assert 0 < steps[0]["policy_tokens"] <= 16
