"""Reward hacks against the answer graders: MathVerifier-v0, reasoning-gym tasks, PythonTool-v0's
answer path and partial score, and ALFWorld-v0's partial score. Each hack scores reward 0 (and
partial score 0 where the env has one), beside controls that still score: the gold answer 1, an
empty or wrong answer 0.

Every hack is a reply a policy under optimisation pressure could sample (the first one was found by
a real model). The parts are real: math-verify worker processes, reasoning-gym's generators and
scorers, the sandbox backends for PythonTool. See ``docs/DESIGN.md``, "Grader trust boundaries",
for the rule that stops each one, and ``envs/answer_forms.py`` for the rules themselves.
"""

from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace
from typing import Any

import pytest

import envs  # noqa: F401  (registers the ids)
from envs.alfworld.progress import partial_score as alfworld_partial
from envs.math_verifier import MathVerifierEnv
from envs.python_tool import PythonToolEnv
from envs.tasks import get_task_source
from envs.verifier import VerifierPool
from fr_agents.errors import InfrastructureFailure
from tools_sandbox import SandboxLimits

ADD = {"prompt": "What is 22+48?", "answer": "70"}


def grade(env: Any, task: dict[str, Any], reply: str) -> tuple[float, dict[str, Any]]:
    env.reset(options={"task": task})
    _, reward, _, _, info = env.step(reply)
    return float(reward), info


@pytest.fixture(scope="module")
def boxed(verifier_pool: VerifierPool) -> MathVerifierEnv:
    return MathVerifierEnv(task_source=None, pool=verifier_pool)


@pytest.fixture(scope="module")
def tagged(verifier_pool: VerifierPool) -> MathVerifierEnv:
    return MathVerifierEnv(task_source=None, pool=verifier_pool, answer_format="answer_tag")


@pytest.fixture(scope="module")
def plain(verifier_pool: VerifierPool) -> MathVerifierEnv:
    return MathVerifierEnv(task_source=None, pool=verifier_pool, answer_format="plain")


def assert_unpaid(env: Any, task: dict[str, Any], reply: str) -> dict[str, Any]:
    reward, info = grade(env, task, reply)
    assert reward == 0.0 and info["partial_score"] == 0.0 and not info["correct"], info
    return info


# ------------------------------------------------------------------ MathVerifier: controls


def test_control_number_gold_is_paid_in_every_format(boxed, tagged, plain) -> None:
    for env, reply in [(boxed, r"so \boxed{70}"), (tagged, "<answer>70</answer>"), (plain, "70")]:
        reward, info = grade(env, ADD, reply)
        assert reward == 1.0 and info["partial_score"] == 1.0, info
    for reply in [
        r"\boxed{70.0}",
        r"\boxed{7e1}",
        r"\boxed{x = 70}",
        r"\boxed{70 \text{ apples}}",
        r"\boxed{22+48=70}",
        r"\boxed{\textbf{70}}",
        r"\boxed{70 \text{ cm}^2}",
    ]:
        assert grade(boxed, ADD, reply)[0] == 1.0, reply


def test_control_fraction_golds_take_fractions_decimals_and_mixed_numbers(boxed) -> None:
    task = {
        "prompt": "A recipe needs 9 quarter cups of flour. How many cups is that?",
        "answer": r"\frac{9}{4}",
    }
    for reply in [r"\boxed{\frac{9}{4}}", r"\boxed{2.25}", r"\boxed{2\frac{1}{4}}", r"\boxed{18/8}"]:
        assert grade(boxed, task, reply)[0] == 1.0, reply
    assert_unpaid(boxed, task, r"\boxed{9/4 + 0}")


def test_control_empty_and_wrong_answers_score_zero(boxed, plain) -> None:
    assert assert_unpaid(boxed, ADD, "")["reason"] == "no_answer"
    assert assert_unpaid(boxed, ADD, r"\boxed{71}")["reason"] == "wrong"
    assert assert_unpaid(plain, ADD, "")["reason"] == "no_answer"


# ------------------------------------------------------------------ MathVerifier: restated expressions


def test_hack_the_real_models_restatement_in_plain_format(plain) -> None:
    reply = "No. 22+48 is the correct answer. 22+48 is the answer to the question of how many"
    assert_unpaid(plain, ADD, reply)


@pytest.mark.parametrize("fmt", ["boxed", "answer_tag", "plain"])
def test_hack_question_expression_restated_in_every_format(fmt, boxed, tagged, plain) -> None:
    env, reply = {
        "boxed": (boxed, r"The answer is \boxed{22+48}."),
        "answer_tag": (tagged, "<answer>22+48</answer>"),
        "plain": (plain, "22+48"),
    }[fmt]
    info = assert_unpaid(env, ADD, reply)
    assert info["reason"] == "unevaluated"  # math-verify says it equals 70; it is still not a number


@pytest.mark.parametrize(
    "expression",
    [
        "48+22",
        "22 + 48",
        r"\left(22+48\right)",
        "2*35",
        r"2 \times 35",
        r"7 \cdot 10",
        "70+0",
        "71-1",
        r"\frac{22+48}{1}",
        "x = 22+48",
        r"\sqrt{4900}",
        "(22+48)",
    ],
)
def test_hack_expression_of_operands_equal_to_the_gold(boxed, expression) -> None:
    assert assert_unpaid(boxed, ADD, rf"\boxed{{{expression}}}")["reason"] == "unevaluated"


def test_hack_retry_feedback_is_no_equality_oracle_for_expressions(verifier_pool) -> None:
    env = MathVerifierEnv(task_source=None, pool=verifier_pool, max_turns=3)
    feedback = []
    for expression in ["22+48", "22+49"]:  # one equals the gold, one does not: the env says the same
        env.reset(options={"task": ADD})
        obs, reward, terminated, _, _ = env.step(rf"\boxed{{{expression}}}")
        assert reward == 0.0 and not terminated
        feedback.append(obs.replace(expression, "<answer>"))
    assert feedback[0] == feedback[1] and "not a number" in feedback[0]


def test_hack_fraction_restating_a_division_question(boxed, tagged) -> None:
    task = {"prompt": "What is 140 divided by 2?", "answer": "70"}
    for reply in [
        r"\boxed{140/2}",
        r"\boxed{\frac{140}{2}}",
        r"\boxed{\dfrac{140}{2}}",
        r"\boxed{\frac{280}{4}}",
        r"\boxed{70/1}",
        r"\boxed{69\frac{2}{2}}",
    ]:
        assert assert_unpaid(boxed, task, reply)["reason"] == "restated"
    assert assert_unpaid(tagged, task, "<answer>140/2</answer>")["reason"] == "restated"
    assert grade(boxed, task, r"\boxed{70}")[0] == 1.0


def test_hack_fraction_restating_the_question_for_a_decimal_gold(boxed) -> None:
    task = {"prompt": "Write 1/2 as a decimal.", "answer": "0.5"}
    assert assert_unpaid(boxed, task, r"\boxed{\frac{1}{2}}")["reason"] == "restated"
    assert grade(boxed, task, r"\boxed{0.5}")[0] == 1.0


def test_hack_power_restating_the_question(boxed) -> None:
    task = {"prompt": "What is 10 to the power 3?", "answer": "1000"}
    assert assert_unpaid(boxed, task, r"\boxed{10^{3}}")["reason"] == "restated"
    assert assert_unpaid(boxed, task, r"\boxed{10^3}")["reason"] == "restated"
    assert grade(boxed, task, r"\boxed{1000}")[0] == 1.0


def test_hack_scientific_notation_restating_the_question(boxed) -> None:
    times_ten = {"prompt": "What is 7 times 10?", "answer": "70"}
    for reply in [r"\boxed{7e1}", r"\boxed{7 \times 10^{1}}", r"\boxed{7\cdot 10^1}"]:
        assert assert_unpaid(boxed, times_ten, reply)["reason"] == "restated"
    thousand = {"prompt": "What is 1.5 times 1000?", "answer": "1500"}
    assert assert_unpaid(boxed, thousand, r"\boxed{1.5e3}")["reason"] == "restated"
    assert grade(boxed, thousand, r"\boxed{1500}")[0] == 1.0


def test_hack_huge_expression_scores_zero_without_infrastructure_failure(verifier_pool) -> None:
    env = MathVerifierEnv(task_source=None, pool=verifier_pool, verify_timeout=1.5)
    info = assert_unpaid(env, ADD, r"\boxed{9^{9^{9^{9}}}}")
    assert info["reason"] in ("timeout", "unparsable", "wrong")  # never an InfrastructureFailure


# ------------------------------------------------------------------ MathVerifier: several answers in one


@pytest.mark.parametrize(
    "reply",
    [
        r"\boxed{70, 71}",
        r"\boxed{71, 70}",
        r"\boxed{\{70, 71\}}",
        r"\boxed{70 \text{ or } 71}",
        r"\boxed{70 \text{ or more}}",
        r"\boxed{70 or 71}",
        r"\boxed{[70, 71]}",
        r"\boxed{70 \pm 1}",
    ],
)
def test_hack_several_candidates_in_one_box(boxed, reply) -> None:
    assert_unpaid(boxed, ADD, reply)


@pytest.mark.parametrize(
    "relation",
    [
        r"x \neq 71",
        r"x \ne 71",
        "x != 71",
        r"x \not= 71",
        "x < 71",
        "x <= 71",
        r"x \leq 71",
        r"x \approx 70",
        "70 = 22+48",
        "x = 22+48",
        "a = 70, b = 71",
        r"a = 71 \quad b = 70",
        "x == 70",
    ],
)
def test_hack_relations_other_than_one_stated_value(boxed, relation) -> None:
    assert_unpaid(boxed, ADD, rf"\boxed{{{relation}}}")


def test_hack_several_boxes_only_the_last_counts(boxed) -> None:
    assert_unpaid(boxed, ADD, r"\boxed{70} or maybe \boxed{71}")
    assert_unpaid(boxed, ADD, r"\boxed{70} \boxed{}")  # an empty last box is no answer


@pytest.mark.parametrize(
    "reply",
    ["The answer is not 70 but 71", "The answer is not 71 but 70", "70 71", "71 70", "70 or 71"],
)
def test_hack_not_x_but_y_in_either_order_in_plain_format(plain, reply) -> None:
    assert_unpaid(plain, ADD, reply)


def test_hack_not_x_but_y_inside_the_box(boxed, tagged) -> None:
    assert_unpaid(boxed, ADD, r"\boxed{\text{not } 71 \text{ but } 70}")
    assert_unpaid(tagged, ADD, "<answer>not 71 but 70</answer>")


def test_hack_echo_of_the_prompt_with_its_box(boxed) -> None:
    obs, _ = boxed.reset(options={"task": ADD})
    _, reward, _, _, info = boxed.step(obs)  # the instruction's empty \boxed{} is the last box
    assert reward == 0.0 and info["extracted"] == ""
    task = {"prompt": r"Example: 1+1 is \boxed{2}. What is 22+48?", "answer": "70"}
    obs, _ = boxed.reset(options={"task": task})
    assert boxed.step(obs)[1] == 0.0


# ------------------------------------------------------------------ MathVerifier: digit and separator tricks


@pytest.mark.parametrize("digits", ["٧٠", "７０", "۷۰", "𝟳𝟬"])
def test_hack_non_ascii_digits(boxed, plain, digits) -> None:
    assert assert_unpaid(boxed, ADD, rf"\boxed{{{digits}}}")["verify_path"] == "form"
    assert_unpaid(plain, ADD, digits)


@pytest.mark.parametrize(
    "reply", [r"\boxed{7,0}", r"\boxed{70,000}", r"\boxed{0,070}", r"\boxed{7 0}", r"\boxed{70{,}0}"]
)
def test_hack_thousands_separator_tricks(boxed, reply) -> None:
    assert_unpaid(boxed, ADD, reply)


def test_control_real_thousands_separators_still_count(boxed) -> None:
    task = {"prompt": "What is 1000*1000?", "answer": "1000000"}
    for reply in [r"\boxed{1,000,000}", r"\boxed{1{,}000{,}000}", r"\boxed{1\,000\,000}"]:
        assert grade(boxed, task, reply)[0] == 1.0, reply
    assert_unpaid(boxed, task, r"\boxed{1,000,00}")


# ------------------------------------------------------------------ MathVerifier: word and symbolic golds

WORD = {"prompt": "Unscramble the letters of 'silent' into another English word.", "answer": "listen"}


@pytest.mark.parametrize(
    "reply",
    [
        r"\boxed{silent}",
        r"\boxed{netsil}",
        r"\boxed{l i s t e n}",
        r"\boxed{\text{silent}}",
        r"\boxed{listen \cdot 1}",
        r"\boxed{\text{listen or silent}}",
        r"\boxed{tinsel}",
    ],
)
def test_hack_anagrams_and_echoes_of_a_word_gold(boxed, reply) -> None:
    info = assert_unpaid(boxed, WORD, reply)
    assert info["gold_kind"] == "text" and info["verify_path"] == "text"


def test_control_word_gold_normalized_compare(boxed, plain) -> None:
    for reply in [r"\boxed{listen}", r"\boxed{Listen}", r"\boxed{\text{ listen }}", r"\boxed{LISTEN.}"]:
        assert grade(boxed, WORD, reply)[0] == 1.0, reply
    assert grade(plain, WORD, "listen")[0] == 1.0
    assert_unpaid(boxed, WORD, r"\boxed{}")


def test_hack_symbolic_question_restated_verbatim_or_reordered(boxed) -> None:
    task = {"prompt": "Expand $(x+1)^2$.", "answer": "x^2+2x+1"}
    assert assert_unpaid(boxed, task, r"\boxed{(x+1)^2}")["reason"] == "restated"
    assert assert_unpaid(boxed, task, r"\boxed{\left(x + 1\right)^2}")["reason"] == "restated"
    assert grade(boxed, task, r"\boxed{x^2 + 2x + 1}")[0] == 1.0
    for reordered in [r"\boxed{(1+x)^2}", r"\boxed{(1 + x)^{2}}", r"\boxed{\left(1+x\right)^2}"]:
        assert assert_unpaid(boxed, task, reordered)["reason"] == "restated"
    factor = {"prompt": "Factor $x^2-1$.", "answer": "(x-1)(x+1)"}
    assert assert_unpaid(boxed, factor, r"\boxed{-1+x^2}")["reason"] == "restated"
    assert grade(boxed, factor, r"\boxed{(x+1)(x-1)}")[0] == 1.0
    root = {"prompt": r"Simplify $\frac{\sqrt{8}}{2}$.", "answer": r"\sqrt{2}"}
    assert assert_unpaid(boxed, root, r"\boxed{\frac{\sqrt{8}}{2}}")["reason"] == "restated"
    assert grade(boxed, root, r"\boxed{\sqrt{2}}")[0] == 1.0


# ------------------------------------------------------------------ reasoning-gym: echoes of the input


def _echo(name: str, task: dict[str, Any]) -> str:
    """The question's own input, unsolved."""
    meta = task["metadata"]["rg"]
    if name == "spell_backward":
        return meta["word"]
    if name == "word_sorting":
        return ", ".join(meta["transformed_words"])
    if name == "letter_jumble":
        return " ".join(meta["scrambled_words"])
    return task["prompt"].split(": ", 1)[1].strip()  # sentence_reordering: the shuffled sentence


@pytest.mark.parametrize("name", ["spell_backward", "word_sorting", "letter_jumble", "sentence_reordering"])
def test_hack_reasoning_gym_echo_of_the_input_beside_gold_and_empty_controls(verifier_pool, name) -> None:
    env = MathVerifierEnv(task_source=None, pool=verifier_pool, max_answer_chars=2000)
    tasks = [
        t for t in get_task_source("reasoning_gym", seed=0, name=name, size=12, test_size=0).split("train")
    ]
    echoed = 0
    for task in tasks:
        echo = _echo(name, task)
        assert task["answer"] not in task["prompt"]  # the gold is not in the prompt
        if echo.strip().lower() == task["answer"].strip().lower():
            continue  # a palindrome or an already sorted list: the echo is the right answer
        info = assert_unpaid(env, task, rf"\boxed{{{echo}}}")
        assert info["verify_path"] == "reasoning_gym"
        echoed += 1
        reward, info = grade(env, task, rf"\boxed{{{task['answer']}}}")  # control: the gold is paid
        assert reward == 1.0 and info["scorer_score"] == 1.0
        assert_unpaid(env, task, "")  # control: no answer
    assert echoed >= 8


def test_hack_reasoning_gym_partial_scorer_credit_pays_nothing(verifier_pool) -> None:
    env = MathVerifierEnv(task_source=None, pool=verifier_pool, max_answer_chars=2000)
    task = get_task_source("reasoning_gym", seed=0, name="word_sorting", size=4, test_size=0).split("train")[
        0
    ]
    scrambled = list(reversed(task["metadata"]["rg"]["sorted_words"]))  # every word, wrong order
    info = assert_unpaid(env, task, rf"\boxed{{{', '.join(scrambled)}}}")
    assert 0.0 < info["scorer_score"] < 1.0 and info["reason"] == "partial"


@pytest.mark.parametrize("name", ["chain_sum", "basic_arithmetic"])
def test_hack_reasoning_gym_arithmetic_expression_echo(verifier_pool, name) -> None:
    env = MathVerifierEnv(task_source=None, pool=verifier_pool)
    for task in get_task_source("reasoning_gym", seed=0, name=name, size=4, test_size=0).split("train"):
        expression = task["metadata"]["rg"]["expression"]
        assert_unpaid(env, task, rf"\boxed{{{expression}}}")
        assert grade(env, task, rf"\boxed{{{task['answer']}}}")[0] == 1.0


def test_reasoning_gym_task_metadata_keeps_the_scorer_inputs_out_of_the_prompt() -> None:
    task = get_task_source("reasoning_gym", seed=0, name="word_sorting", size=2, test_size=0).split("train")[
        0
    ]
    meta = task["metadata"]
    assert meta["rg_dataset"] == "word_sorting" and meta["rg"]["sorted_words"]
    assert (
        task["answer"] not in task["prompt"] and ", ".join(meta["rg"]["sorted_words"]) not in task["prompt"]
    )


# ------------------------------------------------------------------ verifier failures are not zeros


def test_a_dead_verifier_pool_raises_infrastructure_failure() -> None:
    with VerifierPool(workers=1, timeout_s=10.0, eager=True) as pool:
        env = MathVerifierEnv(task_source=None, pool=pool)
        task = {"prompt": "Simplify sqrt(8)/2.", "answer": r"\sqrt{2}"}
        reply = r"\boxed{\frac{2}{\sqrt{2}}}"  # not the gold's string: math-verify must be asked
        assert grade(env, task, reply)[0] == 1.0
        (worker,) = list(pool._all)
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)
        env.reset(options={"task": task})
        with pytest.raises(InfrastructureFailure) as failure:
            env.step(reply)
        assert failure.value.reason == "verifier_pool"
        assert grade(env, task, reply)[0] == 1.0  # a fresh worker took its place


def test_a_verifier_that_cannot_check_the_gold_in_time_raises_infrastructure_failure() -> None:
    # A deadline no check can meet stands for a machine too loaded to verify: the answer timed out,
    # and so does the gold checked against itself, so the verifier (not the answer) failed.
    with VerifierPool(workers=1, timeout_s=1.0, eager=True) as pool:
        env = MathVerifierEnv(task_source=None, pool=pool, verify_timeout=0.001)
        env.reset(options={"task": {"prompt": "p", "answer": r"\sqrt{2}"}})
        with pytest.raises(InfrastructureFailure) as failure:
            env.step(r"\boxed{\frac{2}{\sqrt{2}}}")
        assert failure.value.reason == "grader_timeout"


def test_an_answer_past_the_deadline_is_the_answers_zero() -> None:
    with VerifierPool(workers=1, timeout_s=1.0, eager=True) as pool:
        env = MathVerifierEnv(task_source=None, pool=pool, verify_timeout=1.0)
        task = {"prompt": "p", "answer": r"\sqrt{2}"}
        info = assert_unpaid(env, task, r"\boxed{10000000!}")
        assert info["reason"] in ("timeout", "worker_died")
        assert grade(env, task, r"\boxed{\sqrt{2}}")[0] == 1.0


# ------------------------------------------------------------------ PythonTool: answer path and partial score

LIMITS = SandboxLimits(memory_mb=256, pids=32, tmpfs_mb=16, call_timeout=5.0)


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def tool_env(backend: str, verifier_pool: VerifierPool, **kw: Any) -> PythonToolEnv:
    return PythonToolEnv(task_source=None, backend=backend, limits=LIMITS, verifier_pool=verifier_pool, **kw)


def cut_after(env: PythonToolEnv, calls: list[str]) -> tuple[float, float]:
    """Run ``calls`` (one reply each), then cut the branch: (info's partial score, partial_score())."""
    env.reset(options={"task": ADD})
    info: dict[str, Any] = {}
    for reply in calls:
        _, reward, term, trunc, info = env.step(reply)
        assert reward == 0.0 and not (term or trunc)
    return float(info["partial_score"]), env.partial_score()


@pytest.mark.parametrize(
    "calls",
    [
        [call("print(*range(20001))")],  # every integer up to 20,000 "holds" 70
        [call("for i in range(20001):\n    print(i)")],
        [call("print(1)")],  # a call that merely runs
        [call("print(68)"), call("print(69)"), call("print(70)"), call("print(71)")],  # one guess per call
        [call("print([68, 69, 70, 71])")],
        [call("print(70)\nprint(0)")],
        [call("print(70)"), call("1/0")],  # the shown answer, then a failing call: the last call counts
        [call("print('22+48')")],
    ],
    ids=[
        "print-range",
        "loop-range",
        "runs-only",
        "guess-per-call",
        "candidate-list",
        "answer-then-more",
        "answer-then-error",
        "expression-text",
    ],
)
def test_hack_python_tool_partial_score_farming(backend, verifier_pool, calls) -> None:
    env = tool_env(backend, verifier_pool)
    try:
        assert cut_after(env, calls) == (0.0, 0.0)
    finally:
        env.close()


def test_hack_python_tool_restated_final_answer(backend, verifier_pool) -> None:
    env = tool_env(backend, verifier_pool)
    try:
        env.reset(options={"task": ADD})
        env.step(call("print(22 + 48)"))
        _, reward, term, _, info = env.step(r"\boxed{22+48}")
        assert term and reward == 0.0 and info["partial_score"] == 0.0 and info["reason"] == "unevaluated"
    finally:
        env.close()


def test_control_python_tool_shown_answer_final_answer_wrong_and_empty(backend, verifier_pool) -> None:
    env = tool_env(backend, verifier_pool)
    try:
        assert cut_after(env, [call("x = 22 + 48\nprint('x =', x)")]) == (0.5, 0.5)
        _, reward, term, _, info = env.step(r"\boxed{70}")
        assert (reward, term, info["partial_score"]) == (1.0, True, 1.0)
        env.reset(options={"task": ADD})
        env.step(call("print(22 + 48)"))
        _, reward, _, _, info = env.step(r"\boxed{71}")  # a wrong final answer earns no tool credit
        assert reward == 0.0 and info["partial_score"] == 0.0
        env.reset(options={"task": ADD})
        _, reward, _, _, info = env.step("")
        assert reward == 0.0 and info["partial_score"] == 0.0
    finally:
        env.close()


# ------------------------------------------------------------------ ALFWorld: partial score farming


def _facts(*facts: tuple[str, ...]) -> list[Any]:
    """PDDL facts as the engine gives them: ``.name`` and ``.arguments`` (each with a ``.name``)."""
    return [SimpleNamespace(name=f[0], arguments=[SimpleNamespace(name=a) for a in f[1:]]) for f in facts]


HEAT = {"object_target": "Apple", "parent_target": "CounterTop", "toggle_target": ""}
LOOK = {"object_target": "Book", "parent_target": "", "toggle_target": "DeskLamp"}
TYPES = [
    ("objecttype", "apple_1", "appletype"),
    ("objecttype", "apple_2", "appletype"),
    ("receptacletype", "countertop_1", "countertoptype"),
    ("receptacletype", "countertop_2", "countertoptype"),
    ("objecttype", "book_1", "booktype"),
    ("objecttype", "lamp_1", "desklamptype"),
    ("receptacleatlocation", "sidetable_1", "loc_lamp"),
    ("inreceptacle", "lamp_1", "sidetable_1"),
]


def test_hack_alfworld_goal_condition_already_true_at_the_start() -> None:
    start = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_1"))
    assert alfworld_partial("pick_heat_then_place_in_recep", HEAT, start, False, initial=start) == 0.0
    assert alfworld_partial("pick_and_place_simple", HEAT, start, False, initial=start) == 0.0
    assert alfworld_partial("pick_two_obj_and_place", HEAT, start, False, initial=start) == 0.0


def test_hack_alfworld_moving_a_preplaced_object_between_goal_receptacles() -> None:
    start = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_1"))
    moved = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_2"))
    assert alfworld_partial("pick_heat_then_place_in_recep", HEAT, moved, False, initial=start) == 0.0


def test_hack_alfworld_lamp_on_and_agent_by_it_at_the_start_even_after_toggling() -> None:
    start = _facts(*TYPES, ("istoggled", "lamp_1"), ("atlocation", "agent1", "loc_lamp"))
    assert alfworld_partial("look_at_obj_in_light", LOOK, start, False, initial=start) == 0.0
    off = _facts(*TYPES, ("atlocation", "agent1", "loc_lamp"))
    # switching it off and on again (any number of times) ends where it started
    assert alfworld_partial("look_at_obj_in_light", LOOK, off, False, initial=start) == 0.0
    assert alfworld_partial("look_at_obj_in_light", LOOK, start, False, initial=start) == 0.0


def test_hack_alfworld_standing_by_a_lamp_without_the_object() -> None:
    start = _facts(*TYPES, ("atlocation", "agent1", "loc_start"))
    by_lamp = _facts(*TYPES, ("atlocation", "agent1", "loc_lamp"))
    assert alfworld_partial("look_at_obj_in_light", LOOK, by_lamp, False, initial=start) == 0.0


def test_hack_alfworld_object_already_hot_at_the_start() -> None:
    start = _facts(*TYPES, ("ishot", "apple_2"))
    assert alfworld_partial("pick_heat_then_place_in_recep", HEAT, start, False, initial=start) == 0.0


def test_hack_alfworld_placing_the_object_without_its_transformation() -> None:
    """A heat task's apple set down on the counter cold, or cooled instead of heated, is only
    acquired (1/3): read in a seed-0 RL run, where placement paid whatever the object's state."""
    start = _facts(*TYPES, ("atlocation", "agent1", "loc_start"))
    cold = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_1"))
    cooled = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_1"), ("iscool", "apple_1"))
    for facts in (cold, cooled):
        assert alfworld_partial(
            "pick_heat_then_place_in_recep", HEAT, facts, False, initial=start
        ) == pytest.approx(1 / 3)
    # the same placement is the whole of a pick-and-place task's progress
    assert alfworld_partial("pick_and_place_simple", HEAT, cold, False, initial=start) == 1.0


def test_control_alfworld_real_progress_counts() -> None:
    start = _facts(*TYPES, ("inreceptacle", "apple_1", "countertop_1"), ("atlocation", "agent1", "loc_start"))
    held = _facts(*TYPES, ("holds", "agent1", "apple_1"))
    hot = _facts(*TYPES, ("holds", "agent1", "apple_1"), ("ishot", "apple_1"))
    assert alfworld_partial(
        "pick_heat_then_place_in_recep", HEAT, held, False, initial=start
    ) == pytest.approx(1 / 3)
    assert alfworld_partial(
        "pick_heat_then_place_in_recep", HEAT, hot, False, initial=start
    ) == pytest.approx(2 / 3)
    placed = _facts(*TYPES, ("inreceptacle", "apple_2", "countertop_2"), ("ishot", "apple_2"))
    assert alfworld_partial("pick_heat_then_place_in_recep", HEAT, placed, False, initial=start) == 1.0
    look = _facts(
        *TYPES, ("holds", "agent1", "book_1"), ("istoggled", "lamp_1"), ("atlocation", "agent1", "loc_lamp")
    )
    assert alfworld_partial("look_at_obj_in_light", LOOK, look, False, initial=start) == 1.0
    assert alfworld_partial("look_at_obj_in_light", LOOK, start, True, initial=start) == 1.0  # won
    assert alfworld_partial("look_at_obj_in_light", LOOK, start, False, initial=start) == 0.0  # nothing done
