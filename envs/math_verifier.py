"""``fr_agents/MathVerifier-v0``: answer a math problem, scored by math-verify.

One episode::

    env = gymnasium.make("fr_agents/MathVerifier-v0")          # arithmetic tasks, boxed answers
    obs, info = env.reset(seed=0)                               # obs: the problem + an instruction
    obs, reward, terminated, truncated, info = env.step(reply)  # reply: the model's whole text

Reward is 1.0 when the final answer is the gold answer *stated in the gold's form*, else 0.0 (plus
``format_reward`` when that is enabled and the reply has a well-formed final answer). How an answer
is judged depends on the gold (:mod:`envs.answer_forms`, ``info["gold_kind"]``): a number gold needs a
number literal of the same exact value (``22+48`` is never paid for 70, even though it equals it), a
word gold is compared as a normalized string, a mathematical gold by math-verify, and a reasoning-gym
task by its dataset's own scorer (full score only). ``info`` says why: ``reason`` is ``correct``,
``wrong``, ``no_answer``, ``too_long``, ``unevaluated`` (an expression equal to a number gold),
``not_a_number``, ``restated`` (the answer rewrites the question), ``partial`` (a reasoning-gym
scorer's partial score), ``timeout``, ``worker_died``, ``unparsable``, ``scorer_error: ...`` or
``verifier_error: ...``.

When grading itself fails (the verifier pool cannot check, the gold cannot be parsed, the verifier
cannot check the gold against itself within its deadline), ``step`` raises
:class:`fr_agents.errors.InfrastructureFailure` instead of returning a reward: that is no verdict on
the answer. A check that times out on the answer while the gold alone checks in time is the answer's
0 (``reason="timeout"``).

Hack resistance (see :mod:`envs.answer_extract`): with ``answer_format="boxed"`` (the default) only
the *last* ``\\boxed{}`` counts and an unboxed answer never scores; ``"answer_tag"`` does the same
for ``<answer>...</answer>``; answers longer than ``max_answer_chars`` score 0. ``"plain"`` treats
the whole stripped reply as the answer and exists **only** for the tiny arithmetic curriculum,
where a ~1M-parameter model answers ``"12+7="`` with ``"19"``.

Verification runs in :class:`envs.verifier.VerifierPool` worker processes with a hard deadline
(``verify_timeout``); a hung check is killed. Number and word golds never need it for an answer
that can be paid.

With ``max_turns > 1`` a wrong answer gets feedback as the next observation and the agent may try
again; the episode ends when it is right or out of turns (then ``truncated`` is true).

``reset(options={"task": {"prompt": ..., "answer": ...}})`` uses that task instead of drawing one
(eval and the acceptance checks rely on this name). ``env.unwrapped.fork()`` copies the episode so
that tree rollouts can branch after any turn.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, SupportsFloat

from envs.answer_extract import ANSWER_FORMATS, extract_answer, normalize_simple
from envs.answer_forms import (
    classify_gold,
    echoes_prompt,
    math_spans,
    normalize_text,
    parse_number,
    restates_question,
)
from envs.base import TextEnv
from envs.tasks import Task, TaskSource, get_task_source
from envs.tasks.reasoning_gym_source import task_scorer
from envs.verifier import _INT_RE, VerifierPool, shared_pool
from fr_agents.errors import InfrastructureFailure

DEFAULT_SUFFIX = {
    "boxed": "\n\nPut your final answer within \\boxed{}.",
    "answer_tag": "\n\nGive your final answer as <answer>...</answer>.",
    "plain": "",
}
_HOW = {
    "boxed": "inside \\boxed{}",
    "answer_tag": "inside <answer>...</answer>",
    "plain": "as the whole reply",
}


def _judge_by_scorer(scorer: Any, extracted: str) -> dict[str, Any]:
    """A reasoning-gym task graded by its dataset's own ``score_answer``: only a full score (1.0)
    is a success; the raw score is kept in ``scorer_score``. An exception raised by the scorer on
    this answer scores 0 (``scorer_error``): the answer is the only input that varies."""
    try:
        score = float(scorer(extracted))
    except Exception as e:  # noqa: BLE001 - third-party scorer code on an arbitrary answer
        return {
            "correct": False,
            "reason": f"scorer_error: {type(e).__name__}",
            "verify_path": "reasoning_gym",
        }
    full = score >= 1.0
    return {
        "correct": full,
        "reason": "correct" if full else ("partial" if score > 0 else "wrong"),
        "verify_path": "reasoning_gym",
        "scorer_score": score,
    }


class MathVerifierEnv(TextEnv):
    """A single- or multi-turn math problem with a math-verify reward.

    Args:
        task_source: a source name for :func:`envs.tasks.get_task_source`, a :class:`TaskSource`,
            a list of task dicts, or None (then every reset must pass ``options={"task": ...}``).
        task_params: keyword parameters of the named source.
        split: which split to draw from (``train`` or ``test``).
        task_seed: the source's seed (which problems land in which split).
        answer_format: ``boxed`` (default), ``answer_tag`` or ``plain`` (tiny curriculum only).
        prompt_suffix: text appended to every problem; None picks the instruction matching
            ``answer_format`` (empty for ``plain``).
        max_answer_chars: longer extracted answers score 0 (``reason="too_long"``).
        format_reward: bonus added when the reply contains a well-formed final answer (0 = off).
        max_turns: attempts per episode; wrong attempts before the last get feedback.
        feedback: when true the retry message quotes the wrong answer; never the gold one.
        verify_timeout: hard per-check deadline in seconds.
        pool: a :class:`VerifierPool`; None uses the process-wide shared pool.
        render_mode: None or ``"ansi"`` (render returns the transcript).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        task_source: str | TaskSource | Sequence[Task] | None = "arithmetic",
        task_params: dict[str, Any] | None = None,
        split: str = "train",
        task_seed: int = 0,
        answer_format: str = "boxed",
        prompt_suffix: str | None = None,
        max_answer_chars: int = 200,
        format_reward: float = 0.0,
        max_turns: int = 1,
        feedback: bool = True,
        verify_timeout: float = 5.0,
        pool: VerifierPool | None = None,
        render_mode: str | None = None,
        max_text_chars: int = 65536,
    ) -> None:
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format: expected one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
            )
        if max_turns < 1:
            raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
        if max_answer_chars < 1:
            raise ValueError(f"max_answer_chars: must be >= 1, got {max_answer_chars}")
        if verify_timeout <= 0:
            raise ValueError(f"verify_timeout: must be > 0, got {verify_timeout}")
        self.check_render_mode(render_mode)
        self.init_text(render_mode, max_text_chars)
        self.answer_format = answer_format
        self.prompt_suffix = DEFAULT_SUFFIX[answer_format] if prompt_suffix is None else prompt_suffix
        self.max_answer_chars = max_answer_chars
        self.format_reward = float(format_reward)
        self.max_turns = max_turns
        self.feedback = feedback
        self.verify_timeout = float(verify_timeout)
        self._pool = pool
        self._source_spec = task_source
        self._task_params = dict(task_params or {})
        self._split_name = split
        self._task_seed = task_seed
        self._split: Sequence[Task] | None = None
        self._task: Task | None = None
        self._turn = 0

    # ------------------------------------------------------------------ tasks

    def _tasks(self) -> Sequence[Task]:
        if self._split is None:
            spec = self._source_spec
            if spec is None:
                raise ValueError(
                    'task_source is None: pass reset(options={"task": {"prompt": ..., "answer": ...}})'
                )
            if isinstance(spec, str):
                spec = get_task_source(spec, seed=self._task_seed, **self._task_params)
            self._split = spec.split(self._split_name) if isinstance(spec, TaskSource) else list(spec)
            if not self._split:
                raise ValueError(f"split: the '{self._split_name}' split of the task source is empty")
        return self._split

    @staticmethod
    def _given_task(task: Any) -> Task:
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str) or "answer" not in task:
            raise ValueError('options["task"]: expected a dict with str "prompt" and "answer"')
        return Task(
            id=str(task.get("id", "given")),
            prompt=task["prompt"],
            answer=str(task["answer"]),
            metadata=dict(task.get("metadata") or {}),
        )

    @property
    def task(self) -> Task | None:
        """The current episode's task (with its gold answer)."""
        return self._task

    # ------------------------------------------------------------------ gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "task" in options:
            self._task = self._given_task(options["task"])
        else:
            tasks = self._tasks()
            self._task = tasks[int(self.np_random.integers(len(tasks)))]
        self._turn = 0
        self._done = False
        obs = self._task["prompt"] + self.prompt_suffix
        self._transcript = [("problem", obs)]
        return obs, {"task_id": self._task["id"], "turn": 0, "answer_format": self.answer_format}

    def _score(self, reply: str) -> dict[str, Any]:
        """Grade ``reply``: extract the final answer, then judge it by the gold's kind (module docstring)."""
        assert self._task is not None
        gold = self._task["answer"]
        extracted = extract_answer(reply, self.answer_format)
        try:
            scorer = task_scorer(self._task)
        except Exception as e:  # noqa: BLE001 - the task's scorer could not be built: no verdict possible
            raise InfrastructureFailure(
                "grader_setup", f"reasoning-gym scorer: {type(e).__name__}: {e}"
            ) from e
        info: dict[str, Any] = {
            "gold": gold,
            "extracted": extracted,
            "verify_seconds": 0.0,
            "verify_path": None,
            "gold_kind": "reasoning_gym" if scorer is not None else classify_gold(gold),
        }
        if extracted is None:
            return {**info, "correct": False, "reason": "no_answer", "format_ok": False}
        if len(extracted) > self.max_answer_chars:
            return {**info, "correct": False, "reason": "too_long", "format_ok": False}
        if scorer is not None:
            judged = _judge_by_scorer(scorer, extracted)
        elif info["gold_kind"] == "text":
            same = normalize_text(extracted) == normalize_text(gold)
            judged = {"correct": same, "reason": "correct" if same else "wrong", "verify_path": "text"}
        elif info["gold_kind"] == "number":
            judged = self._judge_number(gold, extracted)
        else:
            judged = self._judge_math(gold, extracted)
        return {**info, **judged, "format_ok": True}

    def _verifier(self) -> VerifierPool:
        return self._pool if self._pool is not None else shared_pool()

    def _judge_number(self, gold: str, extracted: str) -> dict[str, Any]:
        """A number gold is paid only for a number literal of the same exact value that does not
        restate the question (:mod:`envs.answer_forms`)."""
        assert self._task is not None
        answer, target = parse_number(extracted), parse_number(gold)
        assert target is not None
        if answer is None:
            return {
                "correct": False,
                "reason": self._why_not_a_number(gold, extracted),
                "verify_path": "form",
            }
        if restates_question(answer, extracted, gold, self._task["prompt"]):
            return {"correct": False, "reason": "restated", "verify_path": "form"}
        same = answer.value == target.value
        if normalize_simple(gold) == normalize_simple(extracted):
            path = "exact"
        elif _INT_RE.match(extracted.strip()) and _INT_RE.match(gold.strip()):
            path = "integer"
        else:
            path = "number"
        return {"correct": same, "reason": "correct" if same else "wrong", "verify_path": path}

    def _why_not_a_number(self, gold: str, extracted: str) -> str:
        """Why an answer that is not a number literal scores 0, for ``info["reason"]`` only: it is
        never paid, so math-verify is asked just to tell ``unevaluated`` (an expression equal to
        the gold: a restated computation) from ``wrong``, ``unparsable`` or ``timeout``. Any
        failure of the pool here is no grading failure: the reward is 0 whatever it would say."""
        try:
            v = self._verifier().check(gold, extracted, timeout_s=self.verify_timeout)
        except InfrastructureFailure:
            return "not_a_number"
        if v.correct:
            return "unevaluated"
        return v.reason if v.reason in ("wrong", "unparsable", "timeout", "worker_died") else "not_a_number"

    def _judge_math(self, gold: str, extracted: str) -> dict[str, Any]:
        """A mathematical gold: math-verify's equality, unless the answer copies the prompt (a piece
        of its text, or one of its math spans up to the order of terms).

        Raises :class:`InfrastructureFailure` when the verifier, not the answer, failed: the pool
        cannot check, the gold cannot be parsed, or a check that timed out / crashed was in the
        gold's phase or the pool then cannot even check the gold against itself in time."""
        assert self._task is not None
        if echoes_prompt(extracted, gold, self._task["prompt"]):
            return {"correct": False, "reason": "restated", "verify_path": "form"}
        pool = self._verifier()
        v = pool.check(gold, extracted, timeout_s=self.verify_timeout, spans=math_spans(self._task["prompt"]))
        judged = {
            "correct": v.correct,
            "reason": v.reason,
            "verify_path": v.path,
            "verify_seconds": v.seconds,
        }
        if v.reason == "gold_unparsable":
            raise InfrastructureFailure("gold_unparsable", f"math-verify cannot parse the gold {gold!r}")
        failed = v.reason in ("timeout", "worker_died") or v.reason.startswith("verifier_error")
        if failed:
            kind = "grader_timeout" if v.reason == "timeout" else "verifier_error"
            if v.phase == "gold":
                raise InfrastructureFailure(kind, f"{v.reason} while parsing the gold {gold!r}")
            if not pool.self_check(gold, timeout_s=self.verify_timeout):
                raise InfrastructureFailure(
                    kind, f"{v.reason} on the answer, and the verifier cannot check the gold alone"
                )
        return judged

    def _retry_message(self, result: dict[str, Any]) -> str:
        left = self.max_turns - self._turn
        tries = f"{left} attempt{'s' if left != 1 else ''} left"
        if result["reason"] == "no_answer":
            return f"No final answer found. Give your final answer {_HOW[self.answer_format]}. ({tries})"
        if result["reason"] == "too_long":
            return f"Your final answer is longer than {self.max_answer_chars} characters. ({tries})"
        if result["gold_kind"] == "number" and result["verify_path"] == "form":
            # the same words whether the expression equals the gold or not: no free equality oracle
            return (
                f"Your answer {result['extracted']} is not a number. State the result as a number. ({tries})"
            )
        if self.feedback and result["extracted"] is not None:
            return f"Your answer {result['extracted']} is incorrect. Try again. ({tries})"
        return f"That is incorrect. Try again. ({tries})"

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action: expected the model's reply as a str, got {type(action).__name__}")
        self.ensure_running(ready=self._task is not None)
        self._turn += 1
        self._transcript.append(("agent", action))
        result = self._score(action)
        reward = (1.0 if result["correct"] else 0.0) + (self.format_reward if result["format_ok"] else 0.0)
        out_of_turns = self._turn >= self.max_turns
        terminated = bool(result["correct"]) or self.max_turns == 1
        truncated = not terminated and out_of_turns
        self._done = terminated or truncated
        obs = "" if self._done else self._retry_message(result)
        if obs:
            self._transcript.append(("feedback", obs))
        info = {
            **result,
            "turn": self._turn,
            "won": bool(result["correct"]),
            "task_id": self._task["id"],
            # a one-step task has no intermediate progress: 1 when solved, else 0
            "partial_score": 1.0 if result["correct"] else 0.0,
        }
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ branching

    def fork(self) -> MathVerifierEnv:
        """An independent copy of this env mid-episode (same task, turn and RNG state).

        The copy shares the verifier pool and the (read-only) task list; stepping it does not affect
        this env. Tree rollouts call this to branch one prefix into several continuations.
        """
        twin = copy.copy(self)
        twin._transcript = list(self._transcript)
        twin._np_random = copy.deepcopy(self._np_random)
        twin._task = copy.deepcopy(self._task)
        return twin
