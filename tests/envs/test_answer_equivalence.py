"""Answer equivalence through the whole env path: extraction of the last box, then math-verify.

Every case is (gold, reply, expected correct). Replies use ``\\boxed{}`` unless the case is about
what happens without one.
"""

from __future__ import annotations

import time

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.verifier import VerifierPool

FRACTIONS_DECIMALS = [
    ("1/2", r"\boxed{0.5}", True),
    (r"\frac{1}{2}", r"so \boxed{0.5}", True),
    ("0.5", r"\boxed{\frac12}", True),
    ("3/4", r"\boxed{0.75}", True),
    ("0.25", r"\boxed{\dfrac{1}{4}}", True),
    ("3", r"\boxed{\frac{6}{2}}", True),
    ("1/3", r"\boxed{0.3}", False),
    ("2/3", r"\boxed{0.6}", False),
]
SETS_INTERVALS = [
    (r"\{1,2\}", r"\boxed{\{2,1\}}", True),
    ("[1,2)", r"\boxed{[1,2)}", True),
    ("[1,2)", r"\boxed{(1,2)}", False),
    (r"(0,\infty)", r"\boxed{(0, \infty)}", True),
    (r"(-\infty, 3]", r"\boxed{(-\infty,3]}", True),
    (r"\{1,2,3\}", r"\boxed{\{1,2\}}", False),
]
UNITS = [
    ("5", r"\boxed{5\text{ cm}}", True),
    ("5", r"\boxed{5 \mathrm{cm}}", True),
    (r"5 \text{ cm}", r"\boxed{5}", True),
    ("5", r"\boxed{6\text{ cm}}", False),
]
LATEX_VARIANTS = [
    (r"\sqrt{2}/2", r"\boxed{\frac{\sqrt{2}}{2}}", True),
    (r"\dfrac{1}{2}", r"\boxed{\tfrac{1}{2}}", True),
    ("1000", r"\boxed{10^{3}}", True),
    ("1000", r"\boxed{1,000}", True),
    ("x^2+2x+1", r"\boxed{(x+1)^2}", True),
    (r"\pi", r"\boxed{\pi}", True),
    (r"2\pi", r"\boxed{\pi}", False),
    (r"50\%", r"\boxed{50}", True),
    (r"\left( 1, 2 \right)", r"\boxed{(1,2)}", True),
    ("12", r"\boxed{12.0}", True),
    ("12", r"\boxed{12.00001}", False),
    ("-3", r"\boxed{-3}", True),
    ("3", r"\boxed{-3}", False),
    ("2x", r"\boxed{x+x}", True),
]
EQUATIONS_VALUES = [
    ("x=3", r"\boxed{3}", True),
    ("3", r"\boxed{x=3}", True),
    ("y=2x+1", r"\boxed{2x+1}", True),
    ("3", r"\boxed{x=4}", False),
]
MULTIPLE_ANSWERS = [
    ("3", r"\boxed{3 or 4}", False),
    ("3", r"\boxed{3, 4}", False),
    ("7", r"\boxed{6} then \boxed{7}", True),  # only the last box counts ...
    ("6", r"\boxed{6} then \boxed{7}", False),  # ... even when an earlier one is right
    ("1,2", r"\boxed{2,1}", True),
    ("1,2", r"\boxed{1}", False),
]
UNBOXED_AND_MALFORMED = [
    ("3", "3", False),
    ("3", "The answer is 3 or 4", False),
    ("3", r"\boxed{}", False),
    ("3", r"\boxed{3", False),
    ("3", r"\boxed{\frac{}}", False),
    ("3", "", False),
    ("3", r"\boxed{3} and then \boxed{", False),  # a cut-off last box is no answer, not the earlier one
    ("3", "}{\\boxed}", False),
]
CASES = FRACTIONS_DECIMALS + SETS_INTERVALS + UNITS + LATEX_VARIANTS + EQUATIONS_VALUES + MULTIPLE_ANSWERS
CASES += UNBOXED_AND_MALFORMED


def test_at_least_forty_cases() -> None:
    assert len(CASES) >= 40


@pytest.fixture(scope="module")
def env(verifier_pool: VerifierPool) -> gymnasium.Env:
    e = gymnasium.make("fr_agents/MathVerifier-v0", pool=verifier_pool, task_source=None)
    yield e
    e.close()


def _grade(env: gymnasium.Env, gold: str, reply: str) -> tuple[float, dict]:
    env.reset(options={"task": {"prompt": "problem", "answer": gold}})
    _, reward, terminated, truncated, info = env.step(reply)
    assert terminated and not truncated
    return float(reward), info


@pytest.mark.parametrize(("gold", "reply", "expected"), CASES)
def test_equivalence(env: gymnasium.Env, gold: str, reply: str, expected: bool) -> None:
    reward, info = _grade(env, gold, reply)
    assert reward == (1.0 if expected else 0.0), info
    assert info["correct"] is expected
    assert info["reason"] == ("correct" if expected else info["reason"])


def test_unboxed_answer_is_no_answer_even_when_right(env: gymnasium.Env) -> None:
    reward, info = _grade(env, "3", "I am sure the answer is 3.")
    assert reward == 0.0 and info["reason"] == "no_answer" and info["extracted"] is None


def test_overlong_answer_is_refused(env: gymnasium.Env) -> None:
    reward, info = _grade(env, "1", r"\boxed{" + "1+" * 150 + "0}")
    assert reward == 0.0 and info["reason"] == "too_long"


def test_answer_tag_format(verifier_pool: VerifierPool) -> None:
    e = gymnasium.make(
        "fr_agents/MathVerifier-v0", pool=verifier_pool, task_source=None, answer_format="answer_tag"
    )
    for reply, expected in [
        ("<answer>7</answer>", 1.0),
        ("<answer>6</answer> <answer> 7 </answer>", 1.0),
        (r"\boxed{7}", 0.0),
        ("7", 0.0),
    ]:
        e.reset(options={"task": {"prompt": "3+4?", "answer": "7"}})
        assert e.step(reply)[1] == expected, reply


def test_huge_expression_times_out_cleanly(verifier_pool: VerifierPool) -> None:
    e = gymnasium.make("fr_agents/MathVerifier-v0", pool=verifier_pool, task_source=None, verify_timeout=1.5)
    e.reset(options={"task": {"prompt": "p", "answer": "1"}})
    t0 = time.perf_counter()
    _, reward, terminated, _, info = e.step(r"\boxed{9^{9^{9^{9}}}}")
    assert reward == 0.0 and terminated and info["reason"] == "timeout"
    assert time.perf_counter() - t0 < 1.5 + 1.0
    # the pool still answers afterwards
    e.reset(options={"task": {"prompt": "p", "answer": "1/2"}})
    assert e.step(r"\boxed{0.5}")[1] == 1.0


def test_hung_worker_is_killed_and_replaced() -> None:
    # The worker's own alarm (30 s) is longer than the hard deadline (1 s): the parent must kill it.
    with VerifierPool(workers=1, timeout_s=1.0, inner_timeout_s=30.0) as p:
        p.check("1/2", "0.5", timeout_s=None)  # warm the worker so start-up is not on the clock
        t0 = time.perf_counter()
        v = p.check("1", "10000000!")
        assert not v.correct and v.reason == "timeout" and v.path == "killed"
        assert time.perf_counter() - t0 < 3.0
        assert p.stats["kills"] == 1
        again = p.check("1/2", "0.5")
        assert again.correct and again.path == "math_verify"


def test_fast_paths_only_decide_safe_cases(verifier_pool: VerifierPool) -> None:
    assert verifier_pool.check("19", "19").path == "exact"
    assert verifier_pool.check(r"\frac{1}{2}", r" \frac{1}{2} ").correct
    v = verifier_pool.check("19", "018")
    assert v.path == "integer" and not v.correct
    assert verifier_pool.check("19", "019").correct
    assert verifier_pool.check("0.5", "1/2").path == "math_verify"


def test_fast_path_needs_no_worker_processes() -> None:
    with VerifierPool(workers=2) as p:
        assert p.check("19", "19").correct and not p.check("19", "18").correct
        assert p.stats["pool_checks"] == 0 and not p._all  # nothing was started
