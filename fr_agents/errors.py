"""The error an env raises when grading could not happen, as opposed to a wrong answer.

An RL grader has two ways to say "no": the candidate's work was wrong (reward 0, a signal the
policy should learn from), or the grader itself could not judge it (the sandbox would not start or
died mid-grade, the verifier pool crashed, the grader ran past its own deadline). Scoring the
second as 0 teaches the policy that correct work is wrong. So an env raises
:class:`InfrastructureFailure` from ``reset``/``step`` in the second case, never returns a reward
for it; the rollout stores such a leaf ``aborted`` and training leaves it out (see DESIGN.md,
"Infrastructure failures").

The candidate's own program timing out, crashing or printing garbage is the candidate's failure,
not this one.
"""

from __future__ import annotations


class InfrastructureFailure(RuntimeError):
    """Grading could not happen: ``reason`` names what failed (``sandbox_start``, ``sandbox_died``,
    ``verifier_pool``, ``grader_timeout``...), the message says how."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
