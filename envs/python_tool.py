"""``fr_agents/PythonTool-v0``: solve a math problem with a persistent, sandboxed Python tool.

One episode::

    env = gymnasium.make("fr_agents/PythonTool-v0")
    obs, info = env.reset(seed=0)          # the tool instructions + the problem
    obs, r, term, trunc, info = env.step(
        '<tool_call>{"name": "python", "arguments": {"code": "x = 3**20\\nx"}}</tool_call>'
    )
    # obs == "<tool_response>\\n3486784401\\n</tool_response>"
    obs, r, term, trunc, info = env.step("The answer is \\\\boxed{3486784401}")   # r == 1.0, term

Tool calls are Hermes/Qwen style: ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``
(several per reply are run in order). With ``call_format="tag"`` they are the compact ``<tool>code</tool>``
instead: a ~1M-parameter model learns that rigid, short form (23 tokens for ``<tool>print(4821*7390)</tool>``,
against 68 for the JSON form) from a few hundred demos. With ``allow_fenced=True`` a reply without a
final answer whose ```` ```python ```` blocks hold code runs those blocks too. Each call's output
(stdout, stderr, and a status line for errors, timeouts and restarts) comes back in
``<tool_response>...</tool_response>``.

The code runs in the episode's own sandbox session (:mod:`tools_sandbox`), so variables and imports
persist across calls and turns. The session is opened at the first call (from a warm pool when
``sandbox_pool_size > 0``) and closed when the episode ends, at the next ``reset``, on ``close()``, and
when the env is garbage-collected. A session is never shared between episodes.

A reply without a tool call is the final answer and is graded exactly as ``MathVerifier-v0`` grades it
(an inner :class:`envs.math_verifier.MathVerifierEnv` draws the task and scores the reply: last
``\\boxed{}``, math-verify in a process pool with a hard deadline). After ``max_turns`` replies the
episode is truncated and the last reply is graded. A malformed call (bad JSON, unknown tool, missing
code) gets an explanatory ``<tool_response>`` and the episode goes on. ``info["tool_calls"]`` counts
the calls run so far.

``info["partial_score"]`` measures progress towards the answer (what ``rollout.reward: partial``
trains on when a branch is cut short): 1 for a correct final answer and 0 for a wrong one; an
episode cut short (the turn limit reached while still calling the tool, or a runner's cut) scores
:data:`SHOWN_ANSWER_CREDIT` (1/2) when the gold is a number and the **most recent** tool call ran
without error and the **last number it printed** has the gold's exact value, else 0.

Why exactly that: the credit must be evidence that enumeration or skipped work cannot produce.
Only one number per episode is ever judged (the last one printed by the last call), so printing many
candidates (``print(*range(20000))``, one guess per call) commits to one of them like a final
answer does, and the chance of credit is the chance that this one number is right. Since the credit
(1/2) is below what stating the same number as the answer earns (1), no policy gains by showing a
guess instead of answering. A call that merely runs (``print(1)``) earns nothing: running is not
progress. The number is read as :func:`envs.answer_forms.parse_number` reads answers, so ``70.0``
shows 70 and ``22+48`` shows nothing.

The env has a scripted expert (``env.unwrapped.expert_reply()``, what ``--agent expert`` and the
warm start's ``warm_start.demos=expert`` play): for an arithmetic task (metadata ``a``, ``op``, ``b``, or an
``expression``) it calls the tool with ``print(<expression>)``, then answers with the first line the
sandbox printed. It never reads the gold answer, so a demo's tool result and answer are exactly what
the sandbox printed.

``env.unwrapped.fork()`` branches the episode: the twin gets a fresh sandbox into which the code run
since the last restart is replayed (lazily, at the twin's first call), so its Python state matches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, SupportsFloat

from envs import tool_calls
from envs.answer_extract import extract_answer
from envs.answer_forms import NumberLiteral, parse_number
from envs.base import TextEnv
from envs.math_verifier import MathVerifierEnv
from envs.tasks import Task, TaskSource
from envs.verifier import VerifierPool
from fr_agents.errors import InfrastructureFailure
from tools_sandbox import RunResult, Sandbox, SandboxError, SandboxLimits, create_sandbox, shared_pool

log = logging.getLogger(__name__)

TOOL_NAME = "python"
DEFAULT_TOOL_PROMPT = (
    "You can run Python code with the `python` tool. To call it, write\n"
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 2)"}}\n</tool_call>\n'
    "and the output comes back in <tool_response>...</tool_response>. Variables and imports persist "
    "between calls. When you know the answer, reply without a tool call.\n\n"
)
_FENCE_RE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
_TAG_RE = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
CALL_FORMATS = ("hermes", "tag")
_EXAMPLES = {
    "hermes": '<tool_call>{"name": "python", "arguments": {"code": "print(1 + 1)"}}</tool_call>',
    "tag": "<tool>print(1 + 1)</tool>",
}


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """Every ``<tool_call>`` of ``text`` in order: ``{"code": str}`` or ``{"error": why}``."""
    return tool_calls.parse_tool_calls(text, _check_call)


def parse_tag_calls(text: str) -> list[dict[str, Any]]:
    """Every compact ``<tool>code</tool>`` call of ``text`` in order (``call_format="tag"``)."""
    calls = [
        {"code": m.group(1)} if m.group(1).strip() else {"error": "the <tool> call is empty"}
        for m in _TAG_RE.finditer(text)
    ]
    tail = text[text.rfind("</tool>") + len("</tool>") :] if calls else text
    if "<tool>" in tail:
        calls.append({"error": "a <tool> was opened but never closed with </tool>"})
    return calls


def _check_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name != TOOL_NAME:
        return {"error": f"unknown tool {name!r}; the only tool is {TOOL_NAME!r}"}
    if not isinstance(args.get("code"), str):
        return {"error": 'missing "code": the arguments must be {"code": "<python source>"}'}
    if not args["code"].strip():
        return {"error": '"code" is empty'}
    return {"code": args["code"]}


def format_result(r: RunResult, max_chars: int) -> str:
    """The text of one ``<tool_response>``: output, then a status line when something went wrong."""
    parts = [r.stdout, r.stderr]
    if r.status == "error" and r.exit_code not in (None, 1):
        parts.append(r.describe())
    text = "\n".join(p.rstrip("\n") for p in parts if p)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut]"
    return text if text else "(no output)"


SHOWN_ANSWER_CREDIT = 0.5
_NUMBER_TOKEN_RE = re.compile(
    r"(?<![\w.])[-+]?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?(?:/[0-9]+)?(?![\w.]*[0-9])"
)


def last_number(output: str) -> NumberLiteral | None:
    """The last number token printed in ``output`` (ASCII digits; ``42``, ``-3``, ``0.5``, ``7e1``,
    ``1/2``), parsed as an answer would be; None when there is none."""
    tokens = _NUMBER_TOKEN_RE.findall(output)
    return parse_number(tokens[-1]) if tokens else None


def shows_answer(output: str, gold: str | None) -> bool:
    """Whether the last number of ``output`` has the exact value of the number gold ``gold``
    (``x = 70`` and ``70.0`` show 70; ``70 71`` and ``1..20000`` do not, whatever they contain)."""
    target = parse_number(gold) if gold else None
    shown = last_number(output)
    return target is not None and shown is not None and shown.value == target.value


class PythonToolEnv(TextEnv):
    """Math with a persistent sandboxed Python tool; graded like MathVerifier.

    Args:
        task_source, task_params, split, task_seed, answer_format, prompt_suffix, max_answer_chars,
            verify_timeout, verifier_pool: as in :class:`envs.math_verifier.MathVerifierEnv`, which
            draws the tasks and grades the final answer.
        max_turns: replies per episode (tool-call turns included); default 10.
        backend: sandbox backend, ``auto`` (Docker if its daemon answers, else bubblewrap), ``docker``
            or ``bwrap``. There is no unsandboxed mode.
        limits: :class:`tools_sandbox.SandboxLimits` (or a dict of its fields) for each session.
        sandbox_pool_size: keep this many sessions pre-started in a process-wide warm pool (0: start
            each episode's session when its first call comes).
        call_timeout: hard deadline of one tool call in seconds.
        allow_fenced: also run ```` ```python ```` blocks of replies that have no final answer.
        call_format: ``hermes`` (``<tool_call>{json}</tool_call>``) or ``tag`` (``<tool>code</tool>``).
        max_calls_per_turn: tool calls run per reply; the rest get an error response.
        max_tool_output_chars: each ``<tool_response>`` is cut to this many characters.
        tool_prompt: instructions put before the problem; None for the default, "" for none (when the
            chat template already describes the tool).
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
        verify_timeout: float = 5.0,
        verifier_pool: VerifierPool | None = None,
        max_turns: int = 10,
        backend: str = "auto",
        limits: SandboxLimits | dict[str, Any] | None = None,
        sandbox_pool_size: int = 0,
        call_timeout: float = 10.0,
        allow_fenced: bool = False,
        call_format: str = "hermes",
        max_calls_per_turn: int = 4,
        max_tool_output_chars: int = 4096,
        tool_prompt: str | None = None,
        render_mode: str | None = None,
        max_text_chars: int = 65536,
    ) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns: must be an int >= 1, got {max_turns!r}")
        if call_timeout <= 0:
            raise ValueError(f"call_timeout: must be > 0, got {call_timeout}")
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn: must be >= 1, got {max_calls_per_turn}")
        if max_tool_output_chars < 64:
            raise ValueError(f"max_tool_output_chars: must be >= 64, got {max_tool_output_chars}")
        if backend not in ("auto", "docker", "bwrap"):
            raise ValueError(f"backend: expected 'auto', 'docker' or 'bwrap', got {backend!r}")
        if call_format not in CALL_FORMATS:
            raise ValueError(f"call_format: expected one of {', '.join(CALL_FORMATS)}, got {call_format!r}")
        if sandbox_pool_size < 0:
            raise ValueError(f"sandbox_pool_size: must be >= 0, got {sandbox_pool_size}")
        self.check_render_mode(render_mode)
        if isinstance(limits, dict):
            limits = SandboxLimits(**limits)
        self.grader = MathVerifierEnv(
            task_source=task_source,
            task_params=task_params,
            split=split,
            task_seed=task_seed,
            answer_format=answer_format,
            prompt_suffix=prompt_suffix,
            max_answer_chars=max_answer_chars,
            max_turns=1,
            verify_timeout=verify_timeout,
            pool=verifier_pool,
            max_text_chars=max_text_chars,
        )
        self.init_text(render_mode, max_text_chars)
        self.answer_format = answer_format
        self.max_turns = max_turns
        self.backend = backend
        self.limits = limits or SandboxLimits(call_timeout=call_timeout)
        self.sandbox_pool_size = sandbox_pool_size
        self.call_timeout = float(call_timeout)
        self.allow_fenced = allow_fenced
        self.call_format = call_format
        self.max_calls_per_turn = max_calls_per_turn
        self.max_tool_output_chars = max_tool_output_chars
        self.tool_prompt = DEFAULT_TOOL_PROMPT if tool_prompt is None else tool_prompt
        self._sandbox: Sandbox | None = None
        self._history: list[str] = []  # code run in the current interpreter state (since the last restart)
        self._replay: list[str] = []  # code a forked twin must replay before its first call
        self._turn = 0
        self._tool_calls = 0
        self._malformed = 0
        self._last_call_shows_answer = False  # the most recent call ran and its last number is the gold
        self._done = True
        self._transcript: list[tuple[str, str]] = []
        self._outputs: list[str] = []  # each tool call's output this episode (the expert answers from it)

    # ------------------------------------------------------------------ sandbox

    @property
    def sandbox(self) -> Sandbox | None:
        """The episode's session, once the first call opened it."""
        return self._sandbox

    def _open_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            if self.sandbox_pool_size > 0:
                self._sandbox = shared_pool(self.backend, self.limits, self.sandbox_pool_size).acquire()
            else:
                self._sandbox = create_sandbox(self.backend, self.limits)
            replay, self._replay = self._replay, []
            for code in replay:
                r = self._sandbox.run_python(code, timeout=self.call_timeout)
                if r.restarted:  # the replayed state is gone again; keep what still holds
                    self._history.clear()
                    log.warning(
                        "replaying forked state hit %s; the twin starts from an empty state", r.status
                    )
                    break
                self._history.append(code)
        return self._sandbox

    def _close_sandbox(self) -> None:
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            sb.close()

    def _run(self, code: str) -> str:
        try:
            r = self._open_sandbox().run_python(code, timeout=self.call_timeout)
        except SandboxError as e:
            # The sandbox itself failed (it could not start, the daemon is gone, it is closed): the
            # tool never ran the code, so the episode cannot go on honestly. A crash of the agent's
            # own program is not this (``r.restarted`` below); this is the infrastructure's.
            log.warning("python tool: %s", e)
            self._close_sandbox()
            raise InfrastructureFailure("sandbox_failed", f"the python tool's sandbox failed: {e}") from e
        self._tool_calls += 1
        if r.restarted:
            self._history.clear()
        else:
            self._history.append(code)
        body = format_result(r, self.max_tool_output_chars)
        self._outputs.append(body)
        self._last_call_shows_answer = r.status == "ok" and shows_answer(r.stdout, self._gold())
        return body

    def _gold(self) -> str | None:
        task = self.grader.task
        return None if task is None else str(task["answer"])

    def partial_score(self, correct: bool = False) -> float:
        """Progress of this episode (module docstring): 1 when correct, else
        :data:`SHOWN_ANSWER_CREDIT` when the most recent tool call ran without error and the last
        number it printed is the (number) gold, else 0."""
        if correct:
            return 1.0
        return SHOWN_ANSWER_CREDIT if self._last_call_shows_answer else 0.0

    # ------------------------------------------------------------------ gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_sandbox()
        problem, info = self.grader.reset(seed=seed, options=options)
        self._history, self._replay, self._outputs = [], [], []
        self._turn = self._tool_calls = self._malformed = 0
        self._last_call_shows_answer = False
        self._done = False
        obs = self.tool_prompt + problem
        self._transcript = [("problem", obs)]
        return obs, {**info, "tool_calls": 0}

    def _calls_in(self, action: str) -> list[dict[str, Any]]:
        calls = parse_tag_calls(action) if self.call_format == "tag" else parse_tool_calls(action)
        if not calls and self.allow_fenced and extract_answer(action, self.answer_format) is None:
            calls = [{"code": c} for c in _FENCE_RE.findall(action) if c.strip()]
        return calls

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action: expected the model's reply as a str, got {type(action).__name__}")
        self.ensure_running()
        self._turn += 1
        self._transcript.append(("agent", action))
        calls = self._calls_in(action)
        if calls and self._turn < self.max_turns:
            responses = []
            for i, call in enumerate(calls):
                if i >= self.max_calls_per_turn:
                    body = (
                        f"Error: at most {self.max_calls_per_turn} tool calls "
                        "per reply; this one was not run."
                    )
                elif "error" in call:
                    self._malformed += 1
                    body = f"Error: {call['error']}. A call looks like {_EXAMPLES[self.call_format]}"
                else:
                    body = self._run(call["code"])
                responses.append(f"<tool_response>\n{body}\n</tool_response>")
            obs = "\n".join(responses)
            self._transcript.append(("tool", obs))
            info = {
                "turn": self._turn,
                "tool_calls": self._tool_calls,
                "malformed_calls": self._malformed,
                "partial_score": self.partial_score(),
            }
            return obs, 0.0, False, False, info
        # A final answer, or the last allowed turn: grade the reply as MathVerifier does.
        try:
            _, reward, _, _, graded = self.grader.step(action)
        except InfrastructureFailure:  # no verdict: the episode ends without a reward (the rollout aborts it)
            self._done = True
            self._close_sandbox()
            raise
        truncated = bool(calls)  # turns ran out while the agent still wanted to call the tool
        correct = bool(graded.get("correct"))
        self._done = True
        self._close_sandbox()
        info = {
            **graded,
            "turn": self._turn,
            "tool_calls": self._tool_calls,
            "malformed_calls": self._malformed,
            # a final answer is judged on itself (a wrong one earns no progress credit, whatever the
            # tool printed: the graded-answer trust boundary); only a cut-short episode scores progress
            "partial_score": self.partial_score(correct) if truncated else float(correct),
        }
        return "", reward, not truncated, truncated, info

    def release(self) -> None:
        self._close_sandbox()

    # ------------------------------------------------------------------ the scripted expert

    def expert_code(self) -> str:
        """The code the expert runs for the current task: ``print(<expression>)``."""
        task = self.grader.task
        if task is None:
            raise RuntimeError("expert_code() before reset()")
        meta = task.get("metadata") or {}
        if "expression" in meta:
            expression = str(meta["expression"])
        elif {"a", "op", "b"} <= set(meta):
            expression = f"{meta['a']}{meta['op']}{meta['b']}"
        else:
            raise ValueError(
                f"the python-tool expert needs a task whose metadata has 'expression' or 'a', 'op', 'b' "
                f"(the arithmetic source's); task {task.get('id')!r} has {sorted(meta)}"
            )
        return f"print({expression})"

    def expert_action(self) -> str:
        """The expert's next reply: a tool call while none has run, then the answer, which is the
        first line the sandbox printed (never the gold answer), in the env's answer format."""
        if self._done:
            raise RuntimeError("expert_action() on a finished episode")
        if not self._outputs:
            code = self.expert_code()
            if self.call_format == "tag":
                return f"<tool>{code}</tool>"
            return tool_calls.format_call(TOOL_NAME, {"code": code})
        printed = self._outputs[-1].strip().splitlines()
        answer = printed[0].strip() if printed else ""
        if self.answer_format == "boxed":
            return f"\\boxed{{{answer}}}"
        if self.answer_format == "answer_tag":
            return f"<answer>{answer}</answer>"
        return answer

    def expert_reply(self) -> str:
        """:meth:`expert_action` (the reply is already in the env's action format)."""
        return self.expert_action()

    # ------------------------------------------------------------------ branching

    def fork(self) -> PythonToolEnv:
        """An independent copy mid-episode: same task, turn and counters; its own fresh sandbox, into
        which the code run so far (since the last restart) is replayed before its first call."""
        import copy

        twin = copy.copy(self)
        twin.grader = self.grader.fork()
        twin._transcript = list(self._transcript)
        twin._np_random = copy.deepcopy(self._np_random)
        twin._sandbox = None
        twin._replay = list(self._replay) + list(self._history)
        twin._history = []
        twin._outputs = list(self._outputs)
        return twin
