"""The HF engine continues finished rows (fr_agents/policy/opening.py's Continuations): an episode's
next turn and a fork prefill only the tokens added since the row they continue, sample what a
whole prefill samples, and never reuse keys and values across a weight swap."""

from __future__ import annotations

import torch

from fr_agents.models.compact import Past
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine
from fr_agents.policy.opening import Continuations
from tests.fr_agents.test_compact import VOCAB, llama

torch.set_num_threads(1)

STOP = 7


def opts(seed: int) -> SamplingOptions:
    return SamplingOptions(max_tokens=5, seed=seed, stop_token_ids=(STOP,))


def observation(turn: int, n: int = 9) -> list[int]:
    """The env's answer at ``turn``: ``n`` tokens that are never the stop token."""
    g = torch.Generator().manual_seed(100 + turn)
    return torch.randint(10, VOCAB, (n,), generator=g).tolist()


def play(engine: HFEngine, turns: int, first: list[int]) -> tuple[list[list[int]], list[int], list]:
    """A multi-turn episode: each turn's prompt is the whole history (as the rollout sends it).
    Returns each turn's prompt, the prefill tokens each turn cost, and each turn's generation."""
    held, prompts, costs, gens = list(first), [], [], []
    for t in range(turns):
        before = engine.stats["prefill_tokens"]
        gen = engine.generate_sync(held, opts(t))
        prompts.append(list(held))
        costs.append(engine.stats["prefill_tokens"] - before)
        gens.append(gen)
        held += gen.token_ids + observation(t)
    return prompts, costs, gens


def test_a_new_turn_prefills_what_was_added_not_the_history() -> None:
    """Turn t's prefill is the previous turn's last sampled token plus the new observation, however
    long the history; without kept rows it is the whole history, and both sample the same."""
    model = llama(seed=5)
    first = list(range(10, 40))
    engine = HFEngine(model, max_batch_size=4)
    prompts, costs, gens = play(engine, 6, first)
    assert costs[0] == len(first)
    for t in range(1, 6):
        # the row kept all but its last sampled token: that token and the observation are new
        assert costs[t] == 1 + len(observation(t - 1)), (t, costs)
    assert engine.stats["continued_tokens"] == sum(
        len(p) - c for p, c in zip(prompts[1:], costs[1:], strict=True)
    )
    whole = HFEngine(model, max_batch_size=4, keep_tokens=0)
    _, whole_costs, whole_gens = play(whole, 6, first)
    assert whole_costs == [len(p) for p in prompts]  # the history grows, and so does each prefill
    for a, b in zip(gens, whole_gens, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-5)
    engine.close_sync()
    whole.close_sync()


def test_forks_made_together_continue_from_their_parents_row() -> None:
    """Branches of one stored prefix, asked for at once (as an episode forks), each prefill only
    their parent's last token and the observation."""
    model = llama(seed=6)
    engine = HFEngine(model, max_batch_size=4, batch_wait_s=0.05, max_wait_s=0.2)
    first = list(range(10, 50))
    parent = engine.generate_sync(first, opts(0))
    held = first + parent.token_ids + observation(0)
    before = engine.stats["prefill_tokens"]
    futures = [engine.submit(held, opts(10 + b)) for b in range(2)]
    for f in futures:
        f.result()
    assert engine.stats["prefill_tokens"] - before == 2 * (1 + len(observation(0)))
    engine.close_sync()


def test_a_retried_prompt_prefills_in_full_as_without_the_failed_attempt() -> None:
    """An episode retried after an infrastructure failure asks again with the prompt of the attempt
    that failed: a part of that attempt's kept row. It prefills in full and samples exactly (bit
    for bit) what an engine that never ran the failed attempt samples."""
    model = llama(seed=8)
    prompt = list(range(10, 40))
    fresh = HFEngine(model, max_batch_size=4)
    want = fresh.generate_sync(prompt, opts(3))
    engine = HFEngine(model, max_batch_size=4)
    engine.generate_sync(prompt, opts(3))  # the attempt that failed, its row kept
    before = engine.stats["prefill_tokens"]
    got = engine.generate_sync(prompt, opts(3))
    assert engine.stats["prefill_tokens"] - before == len(prompt)
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    fresh.close_sync()
    engine.close_sync()


def test_a_weight_swap_drops_the_kept_rows() -> None:
    """After a swap the next turn prefills its whole history (the kept keys and values came from
    the old weights)."""
    model = llama(seed=7)
    engine = HFEngine(model, max_batch_size=4)
    first = list(range(10, 30))
    gen = engine.generate_sync(first, opts(0))
    assert len(engine.continuations) == 1
    engine.set_weights({k: v.clone() for k, v in model.state_dict().items()}, version=1)
    assert len(engine.continuations) == 0
    held = first + gen.token_ids + observation(0)
    before = engine.stats["prefill_tokens"]
    engine.generate_sync(held, opts(1))
    assert engine.stats["prefill_tokens"] - before == len(held)
    engine.close_sync()


def past(n: int) -> Past:
    return Past([torch.zeros(1, n, 2)], [torch.zeros(1, n, 2)])


def test_continuations_keep_one_entry_per_episode_within_their_bound() -> None:
    c = Continuations(max_tokens=10)
    c.keep([1, 2, 3], past(3))
    c.keep([1, 2, 3, 4, 5], past(5))  # the next turn of the same episode replaces the first
    assert len(c) == 1 and c.held_tokens == 5
    assert c.find([1, 2, 3, 4, 5, 6])[0] == 5
    assert c.find([1, 2, 3, 4, 5])[0] == 0  # a prompt keeps a token of its own
    assert c.find([1, 2, 3, 9, 9])[0] == 0  # only a whole row is continued
    c.keep([1, 2, 3], past(3))  # already held within the longer row
    assert len(c) == 1
    c.keep([8, 9, 10, 11], past(4))
    c.keep([20, 21, 22], past(3))  # over the bound: the least recently used entry goes
    assert c.held_tokens <= 10 and c.find([1, 2, 3, 4, 5, 6])[0] == 0
    assert c.find([8, 9, 10, 11, 12])[0] == 4


def test_rows_with_histories_of_different_lengths_extend_in_one_forward_as_whole_prefills() -> None:
    """compact_extend: rows whose caches hold histories of different lengths append suffixes of
    different lengths in one forward; the logits equal those of prefilling each row's whole
    sequence, and each row's cache then holds the keys and values a whole prefill computes."""
    from fr_agents.models.compact import CompactCache, compact_extend, compact_prefill

    model = llama(seed=9)
    g = torch.Generator().manual_seed(2)
    histories = [torch.randint(10, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 11)]
    suffixes = [torch.randint(10, VOCAB, (n,), generator=g).tolist() for n in (4, 1, 9)]

    def right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return ids, torch.tensor([len(r) for r in rows])

    with torch.no_grad():
        cache = CompactCache(model, 3, 64, torch.device("cpu"))
        compact_prefill(model, *right_padded(histories), 0, cache)
        got = compact_extend(model, *right_padded(suffixes), cache)
        whole = CompactCache(model, 3, 64, torch.device("cpu"))
        want = compact_prefill(
            model, *right_padded([h + s for h, s in zip(histories, suffixes, strict=True)]), 0, whole
        )
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert cache.lengths.tolist() == whole.lengths.tolist() == [9, 18, 20]
    for b, n in enumerate(cache.lengths.tolist()):
        torch.testing.assert_close(cache.keys[1][b, :, :n], whole.keys[1][b, :, :n], rtol=1e-4, atol=1e-5)
