"""The types that cross the seams between the trainer's parts, named once.

The trainer's parts hand each other a tokenizer, a policy model and a way to make envs. Their real
classes live in heavy packages (``transformers``, ``gymnasium``), so this module names them for
annotations only: import these names under ``typing.TYPE_CHECKING`` (nothing here is needed at run
time, and importing it loads no heavy package)::

    from typing import TYPE_CHECKING

    if TYPE_CHECKING:
        from trainer.types import EnvFactory, PolicyModel, Tokenizer

The batch the learner takes is :data:`fr_agents.tree.batch.TrainBatch`; a ledger row is
:class:`fr_agents.ledger.LedgerRow`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable

    import gymnasium
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Tokenizer: TypeAlias = "PreTrainedTokenizerBase"
"""The policy's Hugging Face tokenizer (fast or slow)."""

PolicyModel: TypeAlias = "PreTrainedModel"
"""The policy: a Hugging Face causal LM (``load_policy``'s model)."""

Task: TypeAlias = "dict[str, Any]"
"""One task as a task source gives it (``id``, ``prompt``, ``answer``, ...): a JSON-like record whose
values are the source's own (``envs.tasks.base.Task`` describes the common keys; the trainer does not
import ``envs``)."""

EnvFactory: TypeAlias = "Callable[[], gymnasium.Env[str, str]]"
"""Makes one fresh text env (``cfg.env.id`` with ``cfg.env.kwargs``)."""
