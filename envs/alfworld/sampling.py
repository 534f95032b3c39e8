"""Sample one ALFWorld task (type, targets, object placement) in a scene, respecting ALFRED's rules.

The rules are ALFRED's own tables in ``alfworld.gen.constants``:

* ``GOALS_VALID``: which room kinds allow which task type (heat and cool are kitchen-only, looking at an
  object under a lamp happens in bedrooms and living rooms, cleaning in kitchens and bathrooms);
* ``VAL_RECEPTACLE_OBJECTS``: which receptacle types can hold which object types (used both to place
  objects and, as ``canContain`` facts, by the PDDL ``PutObject`` action);
* ``VAL_ACTION_OBJECTS``: which types are cleanable, heatable, coolable;
* ``MAX_NUM_OF_OBJ_INSTANCES`` / ``PICKUP_REPEAT_MAX``: how many copies of a type to create.

Lamps are never in ``VAL_RECEPTACLE_OBJECTS``: they are placed explicitly on a desk, side table or
dresser. Target objects never start inside a receptacle of the goal type, nor in the fridge or
microwave (ALFRED counts what was in the fridge as already cold), so no game is won at the start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from envs.alfworld.scenes import LAMP_HOLDERS, Receptacle, Scene, constants

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# The receptacle type that performs the state change (never the goal receptacle, never a start place).
_TOOL = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}


class SampleError(ValueError):
    """The scene cannot host the requested task type (try another scene)."""


@dataclass
class TaskSample:
    """A task and a full initial placement, ready to be written as a PDDL problem."""

    task_type: str
    scene: Scene
    object_target: str
    parent_target: str = ""
    toggle_target: str = ""
    # object id -> (object type, receptacle the object starts in)
    objects: dict[str, tuple[str, Receptacle]] = field(default_factory=dict)
    agent_location: tuple[int, int, int, int] = (0, 0, 0, 30)

    @property
    def pddl_params(self) -> dict:
        return {
            "object_target": self.object_target,
            "parent_target": self.parent_target,
            "toggle_target": self.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        }


def scene_allows(task_type: str, scene: Scene) -> bool:
    """Whether ``scene`` can host ``task_type`` at all (room kind and the needed receptacles/lamps)."""
    if scene.kind not in constants().GOALS_VALID[task_type]:
        return False
    try:
        _targets(task_type, scene, random.Random(0))
    except SampleError:
        return False
    return True


def _targets(task_type: str, scene: Scene, rng: random.Random) -> tuple[str, str, str]:
    """Choose (object_target, parent_target, toggle_target) for ``task_type`` in ``scene``."""
    c = constants()
    rtypes = scene.receptacle_types
    if task_type == "look_at_obj_in_light":
        holders = rtypes & set(LAMP_HOLDERS)
        if not scene.lamp_types or not holders:
            raise SampleError("no lamp, or no desk/side table/dresser to put it on")
        candidates = [o for o in scene.object_types if _start_places(scene, o, set())]
        if not candidates:
            raise SampleError("no object to look at")
        return rng.choice(candidates), "", rng.choice(scene.lamp_types)
    tool, ability = _TOOL.get(task_type, (None, None))
    if tool is not None and tool not in rtypes:
        raise SampleError(f"no {tool} in scene {scene.num}")
    pairs = []
    for obj in scene.object_types:
        if ability is not None and obj not in c.VAL_ACTION_OBJECTS[ability]:
            continue
        for parent in sorted(rtypes):
            if parent == tool or not scene.can_contain(parent, obj):
                continue
            if _start_places(scene, obj, {parent}):
                pairs.append((obj, parent))
    if not pairs:
        raise SampleError(f"no (object, receptacle) pair for {task_type} in scene {scene.num}")
    obj, parent = rng.choice(pairs)
    return obj, parent, ""


def target_start_excluded(parent_target: str) -> set[str]:
    """Receptacle types a target object never starts in: the goal's (the game would be won at the
    start), and the fridge, microwave and basins (ALFRED counts what was in them as already cold,
    hot or clean)."""
    return {parent_target, "Fridge", "Microwave", "SinkBasin", "BathtubBasin"} - {""}


def _start_places(scene: Scene, otype: str, excluded: set[str]) -> list[Receptacle]:
    """Where an object of ``otype`` may start: a receptacle that holds it, not of an excluded type."""
    return [r for r in scene.holders_of(otype) if r.type not in excluded]


def sample_task(task_type: str, scene: Scene, rng: random.Random) -> TaskSample:
    """Sample targets and a full initial placement of ``task_type`` in ``scene``."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if scene.kind not in constants().GOALS_VALID[task_type]:
        raise SampleError(f"{task_type} is not allowed in a {scene.kind}")
    c = constants()
    obj_t, parent_t, toggle_t = _targets(task_type, scene, rng)
    sample = TaskSample(task_type, scene, obj_t, parent_t, toggle_t)
    target_excluded = target_start_excluded(parent_t)

    for otype in scene.object_types:
        if otype == obj_t:
            low = 2 if task_type == "pick_two_obj_and_place" else 1
            count = rng.randint(low, max(low, c.PICKUP_REPEAT_MAX - 1))
            places = _start_places(scene, otype, target_excluded)
        else:
            count = rng.randint(1, c.MAX_NUM_OF_OBJ_INSTANCES)
            places = _start_places(scene, otype, set())
        if not places:
            if otype == obj_t:
                raise SampleError(f"nowhere to start {otype}")
            continue
        for k in range(count):
            sample.objects[f"{otype}|{scene.num}|{k + 1}"] = (otype, rng.choice(places))

    if toggle_t:  # explicit lamp placement on a desk, side table or dresser
        holders = [r for r in scene.receptacles if r.type in LAMP_HOLDERS]
        sample.objects[f"{toggle_t}|{scene.num}|1"] = (toggle_t, rng.choice(holders))

    taken = {r.location for r in scene.receptacles}
    for _ in range(100):
        x, z = scene.floor_points[rng.randrange(len(scene.floor_points))]
        loc = (int(round(x / 0.25)), int(round(z / 0.25)), rng.randrange(4), 30)
        if loc not in taken:
            sample.agent_location = loc
            break
    else:  # pragma: no cover - every layout has far more free points than receptacles
        raise SampleError("no free start point")
    return sample
