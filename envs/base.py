"""What the text envs share: the render mode, text spaces, the finished-episode guard, render/close.

Every env of this package is a ``gymnasium.Env[str, str]``: the agent's action is text, the
observation is text. Five of them (:class:`~envs.math_verifier.MathVerifierEnv`,
:class:`~envs.python_tool.PythonToolEnv`, :class:`~envs.humaneval.HumanEvalEnv`,
:class:`~envs.repo_coding.env.RepoCodingEnv`, :class:`~envs.alfworld.env.ALFWorldEnv`) repeat the
same few pieces, kept here once in :class:`TextEnv`:

- the constructor's ``render_mode`` (``None`` or ``"ansi"``) and the text spaces' length
  (:meth:`TextEnv.check_render_mode`, :meth:`TextEnv.init_text`);
- the finished-episode guard: ``step()`` after the episode ended (or before ``reset()``) raises
  ``RuntimeError`` (:meth:`TextEnv.ensure_running`), as gymnasium's ``OrderEnforcing`` does for
  ``step`` before ``reset``;
- ``render()``: the episode's transcript as text in ``"ansi"`` mode, else None;
- ``close()``: free what the env holds (:meth:`TextEnv.release`), then gymnasium's close.

A subclass keeps its own constructor signature and error messages; it calls these pieces where it
used to spell them::

    class EchoEnv(TextEnv):
        def __init__(self, render_mode: str | None = None) -> None:
            self.check_render_mode(render_mode)
            self.init_text(render_mode)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self._done, self._transcript = False, [("user", "say hi")]
            return "say hi", {}

        def step(self, action):
            self.ensure_running()
            self._done = True
            self._transcript.append(("agent", action))
            return "", float(action == "hi"), True, False, {}
"""

from __future__ import annotations

import gymnasium

from fr_agents.spaces import AnyText

FINISHED = "step() called on a finished episode; call reset() first"
"""The guard's message: ``step()`` after the episode ended, or before any ``reset()``."""

DEFAULT_TEXT_CHARS = 65536
"""The text spaces' default length (characters of one observation or action)."""


class TextEnv(gymnasium.Env[str, str]):
    """A text env's shared parts (see the module docstring).

    Attributes set by :meth:`init_text`:
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the transcript).
        observation_space / action_space: :class:`~fr_agents.spaces.AnyText` of the given length.
        _done: True between episodes (before the first ``reset()``, after the last step).
        _transcript: ``(role, text)`` turns of the current episode, as ``render()`` shows them.

    Class attributes a subclass may override:
        transcript_line: how one turn is rendered (``{role}`` and ``{text}``).
        transcript_sep: what joins rendered turns.
    """

    metadata = {"render_modes": ["ansi"]}
    transcript_line = "[{role}] {text}"
    transcript_sep = "\n"

    _done: bool
    _transcript: list[tuple[str, str]]

    @staticmethod
    def check_render_mode(
        render_mode: str | None, message: str = "render_mode: expected None or 'ansi', got {!r}"
    ) -> None:
        """Raise ``ValueError(message.format(render_mode))`` unless ``render_mode`` is None or ``"ansi"``."""
        if render_mode not in (None, "ansi"):
            raise ValueError(message.format(render_mode))

    def init_text(self, render_mode: str | None, max_text_chars: int = DEFAULT_TEXT_CHARS) -> None:
        """Set the render mode, the text spaces, no episode running and an empty transcript."""
        self.render_mode = render_mode
        self.observation_space = AnyText(max_length=max_text_chars)
        self.action_space = AnyText(max_length=max_text_chars)
        self._done = True
        self._transcript = []

    def ensure_running(self, ready: bool = True, message: str = FINISHED) -> None:
        """The finished-episode guard: ``RuntimeError(message)`` when no episode is running (or
        ``ready`` is False, e.g. no task drawn yet)."""
        if self._done or not ready:
            raise RuntimeError(message)

    def render(self) -> str | None:
        """The episode's transcript in ``"ansi"`` mode (one ``transcript_line`` per turn), else None."""
        if self.render_mode != "ansi":
            return None
        return self.transcript_sep.join(
            self.transcript_line.format(role=r, text=t) for r, t in self._transcript
        )

    def release(self) -> None:
        """Free what the env holds (a sandbox, a game engine); nothing by default. ``close()`` calls it."""

    def close(self) -> None:
        """:meth:`release`, then gymnasium's ``close``."""
        self.release()
        super().close()
