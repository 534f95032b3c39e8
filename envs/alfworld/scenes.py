"""Scenes for offline ALFWorld games, read from the layouts that ship inside the ``alfworld`` wheel.

Each AI2-THOR floor plan ``FloorPlanN`` ships three files under ``alfworld/gen/layouts``:

* ``FloorPlanN-objects.json``: the object *types* present in the room (receptacles and objects);
* ``FloorPlanN-openable.json``: every fixed receptacle *instance* (``"Cabinet|+00.68|+00.50|-02.20"``)
  with the pose ``[x, z, rotation, horizon]`` from which the agent can interact with it;
* ``FloorPlanN-layout.npy``: the reachable floor points (metres), used here for start poses and for the
  few receptacles (stove burners, toasters, coffee machines) that have no precomputed pose.

Room kinds and the train/test scene split come from ``alfworld.gen.constants`` (``SCENE_TYPE``,
``TRAIN_SCENE_NUMBERS``, ``TEST_SCENE_NUMBERS``), as in ALFRED: "seen" games use train scenes and the
"unseen" split uses the held-out test scenes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

# Grid step of AI2-THOR navigation (alfworld.gen.constants.AGENT_STEP_SIZE); locations are in steps.
_STEP = 0.25
# Receptacle types whose ALFRED object ids carry a basin suffix: "Sink|x|y|z|SinkBasin".
_BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
# Fixed receptacles that the layouts list as types but without an interaction pose.
_UNPOSED_RECEPTACLES = ("StoveBurner", "Toaster", "CoffeeMachine")  # StoveBurner gets 4 instances
LAMP_TYPES = ("DeskLamp", "FloorLamp")
# Lamps are placed explicitly on one of these (they are not in VAL_RECEPTACLE_OBJECTS for them).
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")


def constants():
    """``alfworld.gen.constants`` (imported lazily: the module is heavy and optional)."""
    import alfworld.gen.constants as c

    return c


def layouts_dir() -> Path:
    import alfworld.gen

    return Path(alfworld.gen.__file__).parent / "layouts"


@dataclass(frozen=True)
class Receptacle:
    """One fixed receptacle instance: ALFRED object id, receptacle type and interaction location."""

    id: str
    type: str
    location: tuple[int, int, int, int]


@dataclass
class Scene:
    """What a floor plan offers to the generator."""

    num: int
    kind: str  # Kitchen, LivingRoom, Bedroom, Bathroom
    object_types: list[str]  # movable (pickupable) object types present
    lamp_types: list[str]  # DeskLamp / FloorLamp present
    receptacles: list[Receptacle]
    floor_points: np.ndarray = field(repr=False)  # (n, 2) metres

    @property
    def receptacle_types(self) -> set[str]:
        return {r.type for r in self.receptacles}

    def can_contain(self, rtype: str, otype: str) -> bool:
        return otype in constants().VAL_RECEPTACLE_OBJECTS.get(rtype, ())

    def holders_of(self, otype: str) -> list[Receptacle]:
        """Receptacle instances in this scene that may hold an object of type ``otype``."""
        return [r for r in self.receptacles if self.can_contain(r.type, otype)]


def scene_kind(num: int) -> str:
    for kind, nums in constants().SCENE_TYPE.items():
        if num in nums:
            return kind
    raise ValueError(f"scene_num {num} is not an AI2-THOR floor plan number")


def _grid(x_m: float, z_m: float) -> tuple[int, int]:
    return int(round(x_m / _STEP)), int(round(z_m / _STEP))


def _movable_types() -> set[str]:
    """Object types that some receptacle may hold (so they can be picked up and placed)."""
    c = constants()
    held: set[str] = set()
    for objs in c.VAL_RECEPTACLE_OBJECTS.values():
        held |= set(objs)
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    return {o for o in held if not o.endswith("Sliced") and o not in static and o in c.OBJECTS_SET}


@cache
def load_scene(num: int) -> Scene:
    """Read floor plan ``num`` from the shipped layouts."""
    root = layouts_dir()
    types = json.loads((root / f"FloorPlan{num}-objects.json").read_text())
    poses = json.loads((root / f"FloorPlan{num}-openable.json").read_text())
    points = np.load(root / f"FloorPlan{num}-layout.npy")
    c = constants()
    receptacles: list[Receptacle] = []
    for rid in sorted(poses):
        x, z, rot, horizon = poses[rid]
        rtype = rid.split("|", 1)[0]
        if rtype in _BASINS:
            rid, rtype = f"{rid}|{_BASINS[rtype]}", _BASINS[rtype]
        if rtype not in c.VAL_RECEPTACLE_OBJECTS:
            continue
        gx, gz = _grid(x, z)
        receptacles.append(Receptacle(rid, rtype, (gx, gz, int(rot) // 90 % 4, int(horizon))))
    # Stove burners, toasters and coffee machines have no pose file entry: give each instance its own
    # reachable floor point (deterministic: evenly spaced through the layout's point list).
    extra = [(t, k) for t in unposed_receptacle_types(num) for k in range(4 if t == "StoveBurner" else 1)]
    taken = {r.location for r in receptacles}
    for i, (rtype, k) in enumerate(extra):
        j = (i + 1) * len(points) // (len(extra) + 1)
        gx, gz = _grid(float(points[j][0]), float(points[j][1]))
        loc = (gx, gz, k % 4, 0)
        while loc in taken:
            loc = (loc[0], loc[1], (loc[2] + 1) % 4, loc[3] + 15)
        taken.add(loc)
        receptacles.append(Receptacle(f"{rtype}|{gx}|{gz}|{k + 1}", rtype, loc))
    movable = _movable_types()
    objects = sorted(t for t in types if t in movable)
    lamps = sorted(t for t in types if t in LAMP_TYPES)
    scene = Scene(num, scene_kind(num), objects, lamps, receptacles, points)
    # Keep only object types that some receptacle of this scene can hold.
    scene.object_types = [o for o in objects if scene.holders_of(o)]
    return scene


def unposed_receptacle_types(num: int) -> list[str]:
    """Receptacle types present in the scene's type list but absent from its pose file."""
    types = json.loads((layouts_dir() / f"FloorPlan{num}-objects.json").read_text())
    return [t for t in _UNPOSED_RECEPTACLES if t in types]


def split_scenes(split: str) -> list[int]:
    """Scene numbers of a split: ``train``/``valid_seen`` use train scenes, ``valid_unseen`` held-out ones."""
    c = constants()
    if split in ("train", "valid_seen"):
        return list(c.TRAIN_SCENE_NUMBERS)
    if split == "valid_unseen":
        return list(c.TEST_SCENE_NUMBERS)
    raise ValueError(f"split must be train, valid_seen or valid_unseen, got {split!r}")
