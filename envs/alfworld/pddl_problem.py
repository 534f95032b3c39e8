"""Write a sampled task as a PDDL problem for ALFWorld's ``alfred.pddl`` domain.

The layout follows ALFRED's own writer (``alfworld.gen.game_states.planned_game_state.state_to_pddl``):
ALFRED object ids mangled into PDDL names (``|`` -> ``_bar_``, ``-`` -> ``_minus_`` ...), every object
type declared as an ``otype`` and every fixed receptacle type as an ``rtype`` (the domain refers to
``SinkBasinType``, ``MicrowaveType`` ... as constants), and the goal taken verbatim from
``alfworld.gen.goal_library``. Only the types in play are declared (see :func:`problem_pddl`).
Unlike ALFRED's planning-time problems, which only listed task-relevant objects, every object of the
room is listed, as in ALFWorld's text games; ``canContain`` facts come from
``VAL_RECEPTACLE_OBJECTS``.
"""

from __future__ import annotations

from envs.alfworld.sampling import TaskSample
from envs.alfworld.scenes import constants

_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")
_MANGLE = (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_"))


def mangle(name: str) -> str:
    """ALFRED id -> PDDL name (the inverse is ``alfworld.agents.utils.misc.Demangler``)."""
    for old, new in _MANGLE:
        name = name.replace(old, new)
    return name


def location_name(loc: tuple[int, int, int, int]) -> str:
    return mangle("loc|" + "|".join(str(int(v)) for v in loc))


def goal_pddl(sample: TaskSample) -> str:
    """The goal from ``goal_library.gdict`` (it also closes the ``define``)."""
    import alfworld.gen.goal_library as glib

    text = glib.gdict[sample.task_type]["pddl"].format(
        obj=sample.object_target, recep=sample.parent_target, toggle=sample.toggle_target, mrecep=""
    )
    # goal_library writes types as "?x # type" (ALFRED replaced '#' by '-' after mangling names).
    return text.replace("#", "-")


def problem_pddl(sample: TaskSample, name: str) -> str:
    """The full PDDL problem text."""
    c = constants()
    scene = sample.scene
    # Types: those present, plus the ones the domain names as constants (CleanObject needs
    # SinkBasinType, HeatObject MicrowaveType, CoolObject FridgeType, SliceObject the knives).
    # ALFRED declared every type; declaring only these keeps Fast Downward's grounding small.
    fixed_rtypes = sorted(scene.receptacle_types | set(_DOMAIN_RTYPES))
    otypes = sorted({t for t, _ in sample.objects.values()} | set(_DOMAIN_OTYPES))
    locations = sorted({r.location for r in scene.receptacles} | {sample.agent_location})

    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in otypes]
    objects += [f"{t}Type - rtype" for t in fixed_rtypes]
    objects += [f"{location_name(loc)} - location" for loc in locations]
    objects += [f"{mangle(r.id)} - receptacle" for r in scene.receptacles]
    objects += [f"{mangle(oid)} - object" for oid in sorted(sample.objects)]

    init = [f"(atLocation agent1 {location_name(sample.agent_location)})"]
    for r in scene.receptacles:
        rid = mangle(r.id)
        init.append(f"(receptacleType {rid} {r.type}Type)")
        init.append(f"(receptacleAtLocation {rid} {location_name(r.location)})")
        if r.type in c.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid})")
    actions = c.VAL_ACTION_OBJECTS
    for oid in sorted(sample.objects):
        otype, recep = sample.objects[oid]
        o = mangle(oid)
        init.append(f"(objectType {o} {otype}Type)")
        init.append(f"(inReceptacle {o} {mangle(recep.id)})")
        init.append(f"(objectAtLocation {o} {location_name(recep.location)})")
        if otype in actions["Toggleable"]:
            init.append(f"(toggleable {o})")
            continue  # lamps stay where they are
        init.append(f"(pickupable {o})")
        if otype in c.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {o})")
        for ability, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
            if otype in actions[ability]:
                init.append(f"({pred} {o})")
        if otype in actions["Sliceable"]:
            init.append(f"(sliceable {o})")
    present_otypes = sorted({t for t, _ in sample.objects.values()})
    for rtype in sorted(scene.receptacle_types):
        for otype in present_otypes:
            if scene.can_contain(rtype, otype):
                init.append(f"(canContain {rtype}Type {otype}Type)")

    body = "\n".join(
        [
            f"(define (problem {name})",
            "(:domain alfred)",
            "(:objects",
            *objects,
            ")",
            "(:init",
            *init,
            ")",
        ]
    )
    return body + "\n" + goal_pddl(sample).strip() + "\n"
