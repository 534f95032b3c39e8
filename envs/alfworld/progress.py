"""Partial progress on an ALFWorld task: the fraction of goal conditions satisfied in the PDDL facts.

The goals in ``alfworld.gen.goal_library`` are conjunctions; their type literals (``objectType``,
``receptacleType``, ``cleanable`` ...) hold from the start for every candidate, so progress is counted
over the state-dependent ones, for the best candidate object:

* pick_and_place_simple: object acquired (held, or already placed), object in a goal-type receptacle;
* clean / heat / cool:   acquired, ``isClean`` / ``isHot`` / ``isCool``, placed once in that state
  (an object placed before it is cleaned, heated or cooled, or after the wrong one of the three,
  counts as acquired only);
* pick_two_obj_and_place: first acquired, first placed, second acquired, second placed;
* look_at_obj_in_light:  object held, lamp toggled, agent at the lamp's location.

"Acquired" counts a placed object too, so carrying an object to its goal never lowers the score.
A won game scores 1.0 whatever the conditions say.

Only what the agent did counts. The score is a function of the current state (never a sum over
steps), so toggling a lamp or picking an object up and putting it down again repeatedly earns
nothing twice. A condition that already held in the game's initial state earns nothing: an object
of the target type lying in a goal-type receptacle at the start is neither "acquired" nor "placed"
by being there (nor by being moved to another goal-type receptacle), a lamp already on is not
"toggled" and an object already hot/cool/clean is not "heated"/"cooled"/"cleaned". Being at the
lamp counts only while holding the object (standing by a lamp, where a game may start, is not
progress). Holding an object never holds at the start.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

_STATE_PRED = {
    "pick_clean_then_place_in_recep": "isclean",
    "pick_heat_then_place_in_recep": "ishot",
    "pick_cool_then_place_in_recep": "iscool",
}


class FactIndex:
    """Facts as ``{predicate: set(argument tuples)}`` (names lower-cased as Fast Downward prints them)."""

    def __init__(self, facts: Iterable[Any]) -> None:
        self.by_pred: dict[str, set[tuple[str, ...]]] = defaultdict(set)
        for fact in facts:
            self.by_pred[fact.name.lower()].add(tuple(v.name.lower() for v in fact.arguments))

    def has(self, pred: str, *args: str) -> bool:
        return tuple(args) in self.by_pred.get(pred, ())

    def of_type(self, pred: str, type_name: str) -> list[str]:
        """Entities ``e`` with ``pred(e, type_name)`` (e.g. objecttype(o, appletype))."""
        t = type_name.lower()
        return sorted(args[0] for args in self.by_pred.get(pred, ()) if args[1] == t)


def partial_score(
    task_type: str,
    params: dict,
    facts: Iterable[Any],
    won: bool,
    initial: FactIndex | Iterable[Any] | None = None,
) -> float:
    """Fraction (0..1) of the goal's state-dependent conditions the agent has made true, for the
    best candidate; ``initial`` is the game's state at reset (module docstring: what held there
    earns nothing)."""
    if won:
        return 1.0
    f = FactIndex(facts)
    f0 = initial if isinstance(initial, FactIndex) else FactIndex(initial or ())
    objs = f.of_type("objecttype", params["object_target"] + "Type")
    held = {o for o in objs if any(args[1] == o for args in f.by_pred.get("holds", ()))}
    if task_type == "look_at_obj_in_light":
        return _look_score(f, f0, params, held)
    goal_receps = set(f.of_type("receptacletype", params["parent_target"] + "Type"))
    placed_at_start = {o for o in objs if any(f0.has("inreceptacle", o, r) for r in goal_receps)}
    placed = {o for o in objs if any(f.has("inreceptacle", o, r) for r in goal_receps)} - placed_at_start
    if task_type == "pick_two_obj_and_place":
        n_placed = min(len(placed), 2)
        holding_another = bool(held - placed) and n_placed < 2
        return (2 * n_placed + int(holding_another)) / 4
    state_pred = _STATE_PRED.get(task_type)
    best = 0
    for o in objs:
        changed = state_pred is not None and f.has(state_pred, o) and not f0.has(state_pred, o)
        # placing pays only once the object is in the goal's state: an uncleaned pot set down where a
        # clean one belongs has to be taken back, so it is no nearer the goal than one held
        placed_done = o in placed and (state_pred is None or changed)
        score = int(o in held or o in placed) + int(changed) + int(placed_done)
        best = max(best, score)
    return best / (3 if state_pred else 2)


def _look_score(f: FactIndex, f0: FactIndex, params: dict, held: set[str]) -> float:
    """look_at_obj_in_light: the object held, a lamp switched on that was off at the start, and
    being at that lamp's location *while holding the object* (standing by a lamp is no progress)."""
    lamps = f.of_type("objecttype", params["toggle_target"] + "Type")
    agent_locs = {args[1] for args in f.by_pred.get("atlocation", ())}
    best_lamp = 0
    for lamp in lamps:
        toggled = f.has("istoggled", lamp) and not f0.has("istoggled", lamp)
        near = bool(held) and any(
            f.has("inreceptacle", lamp, r) and f.has("receptacleatlocation", r, loc)
            for (r, loc) in f.by_pred.get("receptacleatlocation", ())
            if loc in agent_locs
        )
        best_lamp = max(best_lamp, int(toggled) + int(near))
    return (int(bool(held)) + best_lamp) / 3
