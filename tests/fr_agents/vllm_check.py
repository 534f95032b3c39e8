"""Run by test_vllm_engine.py in a subprocess (vLLM wants a __main__ guard): prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> None:
    import gymnasium
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, os.path.dirname(__file__))
    import rollout_envs  # noqa: F401

    from fr_agents.models import create_tiny
    from fr_agents.policy.base import SamplingOptions
    from fr_agents.policy.vllm_engine import VLLMEngine
    from fr_agents.rollout import RolloutOptions, run_episodes_sync
    from fr_agents.tree import TrajectoryTree

    torch.set_num_threads(1)
    d = create_tiny(tempfile.mkdtemp() + "/m", size="micro", seed=0)
    tok = AutoTokenizer.from_pretrained(d)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    engine = VLLMEngine(str(d), dtype="float32", max_model_len=512)
    tree = TrajectoryTree()
    opts = RolloutOptions(temperature=1.0, max_new_tokens=10, max_context=400, max_turns=3)
    res = run_episodes_sync(
        lambda: gymnasium.make("fr_agents_test/Count-v0"), engine, tok, tree, 6, opts, seeds=list(range(6))
    )

    def worst(model, ids_list, lps_list, masks):
        w = 0.0
        for ids, lps, mask in zip(ids_list, lps_list, masks, strict=True):
            t = torch.tensor([ids])
            with torch.no_grad():
                lp = (
                    torch.log_softmax(model(t).logits[0, :-1].float(), -1)
                    .gather(1, t[0, 1:, None])
                    .squeeze(1)
                )
            m = torch.tensor(mask[1:])
            w = max(w, (lp[m] - torch.tensor(lps[1:])[m]).abs().max().item())
        return w

    trs = [tree.trajectory(leaf.leaf_id) for r in res for leaf in r.leaves]
    err = worst(ref, [t.token_ids for t in trs], [t.logprobs for t in trs], [t.policy_mask for t in trs])
    turns = [leaf.turns for r in res for leaf in r.leaves]

    # Weight reload with a version bump: new generations are scored by the new weights.
    torch.manual_seed(0)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in ref.state_dict().items()}
    engine.set_weights(new, 3)
    ref.load_state_dict(new)
    prompt = tok.encode("Write exactly 2 words.")
    g = engine.generate_sync(prompt, SamplingOptions(max_tokens=8))
    err_new = worst(
        ref,
        [prompt + g.token_ids],
        [[0.0] * len(prompt) + g.logprobs],
        [[False] * len(prompt) + [True] * len(g.token_ids)],
    )
    engine.close_sync()
    print(json.dumps({"max_err": err, "turns": turns, "version": g.version, "max_err_after_swap": err_new}))


if __name__ == "__main__":
    main()
