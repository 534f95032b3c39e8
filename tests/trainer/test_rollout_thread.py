"""The embedded rollout thread's ledger writes: the episodes that finish in one turn of its event
loop share one ledger transaction, every episode of a batch is in the ledger before the batch is
reported whole, and the ``episode_done`` hook hears of an episode only once it is recorded.

The episodes here are scripted coroutines (no model): they return an :class:`EpisodeOutcome`
after a chosen number of loop turns, which is all the thread sees of an episode."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
import torch

from fr_agents.ledger import EpisodeLedger
from trainer.batches import EpisodeSchedule
from trainer.episodes import EpisodeOutcome, LeafOutcome
from trainer.rollout_batch import BatchLoop
from trainer.rollout_thread import RolloutThread
from trainer.weights import WeightBoard


class CountingLedger(EpisodeLedger):
    """The real ledger, counting its transactions (one per ``_write``)."""

    def __init__(self, path):
        super().__init__(path)
        self.transactions: list[list[int]] = []

    def _write(self, episodes):
        self.transactions.append([e for e, _, _, _ in episodes])
        super()._write(episodes)


def _thread(tmp_path, ledger, turns_of, *, batches=2, fail_at=None):
    schedule = EpisodeSchedule(num_tasks=100, batch_size=8, max_policy_lag=1)
    board = WeightBoard()
    board.publish(0, {"w": torch.zeros(1)})
    board.publish(1, {"w": torch.zeros(1)})
    heard: list[tuple[int, bool]] = []  # (leaf, was it in the ledger when the hook heard of it)
    done: list[tuple[int, int]] = []  # (batch, episodes of it in the ledger at that moment)

    async def scripted_episode(spec):
        for _ in range(turns_of(spec.episode)):
            await asyncio.sleep(0)
        if spec.episode == fail_at:
            raise RuntimeError("episode failed")
        return EpisodeOutcome(
            [LeafOutcome(leaf_id=1000 + spec.episode, reward=1.0, policy_tokens=3, turns=1)]
        )

    def rows(batch):
        return len(
            sqlite3.connect(ledger.path)
            .execute("SELECT 1 FROM episode_leaves WHERE batch = ?", (batch,))
            .fetchall()
        )

    def episode_done(out):
        heard.append((out.leaf_id, out.leaf_id - 1000 in ledger.leaves([out.leaf_id - 1000])))

    loop = BatchLoop(
        schedule=schedule,
        ledger=ledger,
        set_weights=lambda w, v: None,
        run_episode=scripted_episode,
        concurrency=8,
        on_episode_done=episode_done,
        stopped=lambda: board.stopped,
    )
    thread = RolloutThread(
        batches=loop,
        first_batch=0,
        last_batch=batches,
        board=board,
        on_batch_done=lambda k: done.append((k, rows(k) if k >= 0 else -1)),
    )
    return thread, heard, done


def test_episodes_finishing_in_one_loop_turn_share_one_ledger_transaction(tmp_path):
    ledger = CountingLedger(tmp_path / "episodes.sqlite")
    # batch 0: episodes 0-3 finish after 1 turn, 4-7 after 3; batch 1 likewise
    thread, heard, done = _thread(tmp_path, ledger, lambda e: 1 if e % 8 < 4 else 3)
    thread.run()
    assert thread.error is None
    assert sorted(map(sorted, ledger.transactions)) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    assert done == [(0, 8), (1, 8)]  # each batch whole in the ledger when reported
    assert sorted(leaf for leaf, _ in heard) == list(range(1000, 1016))
    assert all(recorded for _, recorded in heard)  # the hook hears only of recorded episodes
    assert ledger.batch_rows(1)[0] == (8, 1008, 1.0, 3, 0)


def test_a_failed_episode_fails_the_batch_and_keeps_the_finished_ones(tmp_path):
    ledger = CountingLedger(tmp_path / "episodes.sqlite")
    thread, heard, done = _thread(tmp_path, ledger, lambda e: 1 if e != 5 else 2, fail_at=5)
    thread.run()
    assert isinstance(thread.error, RuntimeError) and str(thread.error) == "episode failed"
    assert done == [(-1, -1)]
    kept = set(ledger.leaves(range(8)))
    assert kept == {0, 1, 2, 3, 4, 6, 7}  # recorded: re-run on resume only the failed one


def test_a_ledger_failure_fails_the_batch(tmp_path):
    class BrokenLedger(CountingLedger):  # a fake: a ledger whose disk write fails
        def _write(self, episodes):
            raise sqlite3.OperationalError("disk I/O error")

    ledger = BrokenLedger(tmp_path / "episodes.sqlite")
    thread, heard, done = _thread(tmp_path, ledger, lambda e: 1)
    thread.run()
    assert isinstance(thread.error, sqlite3.OperationalError)
    assert done == [(-1, -1)] and heard == []


@pytest.mark.parametrize("n", [1, 3])
def test_record_outcomes_writes_all_or_nothing(tmp_path, n):
    from trainer.batches import EpisodeSpec

    ledger = EpisodeLedger(tmp_path / "episodes.sqlite")
    specs = [
        EpisodeSpec(episode=i, batch=0, slot=i, member=0, task_index=i, seed=i, version=0) for i in range(n)
    ]
    outs = [
        EpisodeOutcome([LeafOutcome(leaf_id=10 + i, reward=0.5, policy_tokens=2, turns=1)]) for i in range(n)
    ]
    with pytest.raises(ValueError, match="episode 99 has no leaf"):
        ledger.record_outcomes(
            [*zip(specs, outs, strict=True), (EpisodeSpec(99, 0, 99, 0, 0, 0, 0), EpisodeOutcome([]))]
        )
    assert ledger.leaves(range(n)) == {}  # refused before anything was written
    ledger.record_outcomes(zip(specs, outs, strict=True))
    assert ledger.leaves(range(n)) == {i: 10 + i for i in range(n)}


def test_aborted_leaves_have_their_own_rows_and_an_episode_with_only_aborts_is_done(tmp_path):
    """Every leaf of every attempt has one row: trained leaves in ``episode_leaves``, aborted ones
    (grading could not happen) in ``episode_aborts``; an episode whose every attempt aborted is
    recorded with no leaf to train on, so it counts as done and is not run again."""
    from fr_agents.errors import InfrastructureFailure
    from trainer.batches import EpisodeSpec
    from trainer.episodes import aborted_attempt

    ledger = EpisodeLedger(tmp_path / "episodes.sqlite")
    specs = [
        EpisodeSpec(episode=i, batch=0, slot=i, member=0, task_index=i, seed=i, version=0) for i in range(3)
    ]
    retried = EpisodeOutcome(
        [LeafOutcome(leaf_id=11, reward=1.0, policy_tokens=2, turns=1, sampled_tokens=2, attempt=1)],
        [LeafOutcome(11, 0.0, 2, 1, "aborted", None, 2, attempt=0, reason="sandbox_died")],
        attempts=2,
    )
    lost = EpisodeOutcome(
        [],
        [
            aborted_attempt(0, InfrastructureFailure("sandbox_start", "no sandbox")),
            LeafOutcome(12, 0.0, 3, 1, "aborted", None, 3, attempt=1, reason="grader_timeout"),
        ],
        attempts=2,
    )
    plain = EpisodeOutcome([LeafOutcome(leaf_id=10, reward=0.0, policy_tokens=2, turns=1, sampled_tokens=2)])
    ledger.record_outcomes(zip(specs, [plain, retried, lost], strict=True))
    assert ledger.batch_rows(0) == [(0, 10, 0.0, 2, 0), (1, 11, 1.0, 2, 0)]
    assert ledger.aborted_rows(0) == [
        (1, 0, 11, "sandbox_died"),
        (2, 0, None, "sandbox_start"),
        (2, 1, 12, "grader_timeout"),
    ]
    assert ledger.done(range(4)) == {0, 1, 2} and ledger.leaves(range(4)) == {0: 10, 1: 11}
    assert ledger.sampled_tokens(0) == 2 + 2 + 2 + 0 + 3  # what the engine sampled, aborted attempts included
    ledger.record_outcomes(
        [(specs[2], retried)]
    )  # an episode recorded again replaces its rows, aborts included
    assert [r[0] for r in ledger.aborted_rows(0)] == [1, 2] and ledger.done([2]) == {2}
    assert lost.reward != lost.reward and lost.leaf_id == -1 and lost.policy_tokens == 0  # nan: no leaf


def test_a_resumed_rollout_does_not_run_again_an_episode_whose_every_attempt_aborted(tmp_path):
    """Episode 0 was recorded with aborts only (before a crash): the resumed thread runs the rest of
    batch 0, not episode 0, and reports the batch whole."""
    from trainer.batches import EpisodeSpec
    from trainer.episodes import aborted_attempt

    ledger = CountingLedger(tmp_path / "episodes.sqlite")
    lost = EpisodeOutcome(
        [],
        [aborted_attempt(0, RuntimeError("no sandbox")), aborted_attempt(1, RuntimeError("no sandbox"))],
        2,
    )
    ledger.record_outcomes([(EpisodeSpec(0, 0, 0, 0, 0, 0, 0), lost)])
    thread, heard, done = _thread(tmp_path, ledger, lambda e: 1, batches=1)
    thread.run()
    assert thread.error is None and done == [(0, 7)]  # 7 episodes with leaves, episode 0 with aborts only
    assert sorted(leaf for leaf, _ in heard) == list(range(1001, 1008))  # episode 0 was not run again
    assert ledger.done(range(8)) == set(range(8))
