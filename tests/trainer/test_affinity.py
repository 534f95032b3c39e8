"""``trainer.pin_cpus``: the learner and the rollout process run on disjoint CPUs during RL (every
thread of each), the learner gets its CPUs back afterwards, and where it cannot act the plan says
why."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest
import torch

from fr_agents.config import load_config
from tests.trainer.test_loop import BASE as LOOP_BASE
from trainer.loop import Trainer, TrainerHooks
from trainer.os_tuning import cpu_split, pinned, rollout_threads, split, usable_cpus
from trainer.preflight import placement_plan

needs_two = pytest.mark.skipif(len(usable_cpus()) < 2, reason="pinning needs at least 2 usable CPUs")


def thread_masks(pid: int | str = "self") -> list[frozenset[int]]:
    """The CPU mask of every thread of process ``pid``."""
    masks = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            masks.append(frozenset(os.sched_getaffinity(int(tid))))
    return masks


def test_split_gives_the_learner_the_first_cpus_and_the_rollout_the_rest() -> None:
    cpus = usable_cpus()
    if len(cpus) < 2:
        assert split(1) is None
        return
    learner, rollout = split(1)
    assert learner == cpus[:1] and rollout == cpus[1:]
    assert split(len(cpus)) is None, "no CPU left for the rollout: nothing is pinned"
    assert split(0) is None


@needs_two
def test_pinned_moves_every_running_thread_and_gives_the_mask_back() -> None:
    before = frozenset(usable_cpus())
    started, stop = threading.Event(), threading.Event()

    def idle() -> None:
        started.set()
        stop.wait()

    worker = threading.Thread(target=idle)
    worker.start()
    started.wait()
    one = sorted(before)[:1]
    try:
        with pinned(one):
            assert set(thread_masks()) == {frozenset(one)}, "a thread that was already running is pinned too"
            assert os.sched_getaffinity(worker.native_id) == set(one)
        assert set(thread_masks()) == {before}
    finally:
        stop.set()
        worker.join()


def test_pin_cpus_pins_nothing_without_a_rollout_process_and_the_plan_says_why() -> None:
    cfg = load_config("math-tiny", ["trainer.pin_cpus=true", "trainer.backend=local"])
    assert cpu_split(cfg) is None
    assert (
        "cpu pinning: none (trainer.backend=local has no rollout process of its own to pin apart "
        "(pinning acts with trainer.backend=process))"
    ) in placement_plan(cfg)
    everything = load_config("math-tiny", ["trainer.pin_cpus=true", f"trainer.threads={len(usable_cpus())}"])
    assert cpu_split(everything) is None
    assert (
        f"cpu pinning: none (no CPU is left for the rollout beside the learner's {len(usable_cpus())})"
        in placement_plan(everything)
    )


@needs_two
def test_a_pinned_rollout_process_gets_one_torch_thread_per_cpu_it_is_pinned_to() -> None:
    cfg = load_config("math-tiny", ["trainer.pin_cpus=true", "trainer.threads=1"])
    assert rollout_threads(cfg) == len(split(1)[1])
    assert f"({rollout_threads(cfg)} torch thread(s)" in "\n".join(placement_plan(cfg))


@needs_two
def test_the_dry_run_plan_names_the_cpus_of_each_side() -> None:
    cfg = load_config("math-tiny", ["trainer.pin_cpus=true", "trainer.threads=1"])
    learner, rollout = split(1)
    assert (
        f"cpu pinning during RL: learner on CPU(s) {learner}, rollout process on CPU(s) {rollout}"
        in placement_plan(cfg)
    )
    assert not any(
        "pinning" in line
        for line in placement_plan(load_config("math-tiny", ["trainer.threads=1", "trainer.pin_cpus=false"]))
    )


@needs_two
def test_a_pinned_run_keeps_the_learner_and_the_rollout_process_on_disjoint_cpus(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    before = frozenset(usable_cpus())
    seen: dict[str, set[frozenset[int]]] = {"learner": set(), "rollout": set()}

    class Watch(TrainerHooks):
        def run_started(self, trainer):
            self.trainer = trainer

        def around_step(self, step):
            seen["learner"].update(thread_masks())
            seen["rollout"].update(thread_masks(self.trainer.rollout_process.info["pid"]))
            return step()

    cfg = load_config(
        "math-tiny",
        [
            *LOOP_BASE,
            "trainer.backend=process",
            "trainer.threads=1",
            "trainer.pin_cpus=true",
            "trainer.steps=3",
        ],
    )
    res = Trainer(cfg, tmp_path, console=False, hooks=Watch()).run()
    assert res.ok and res.steps == 3
    learner, rollout = split(1)
    assert seen["learner"] == {frozenset(learner)}, "every learner thread, during every step"
    assert seen["rollout"] == {frozenset(rollout)}, "every thread of the rollout process"
    assert set(thread_masks()) == {before}, "the learner's CPUs are given back after RL"
