"""The repositories the offline task builder draws from.

Each :class:`RepoSpec` names a source (``seed:NAME`` for a repository written in this project, under
``seed_repos/``; ``pypi:NAME==VERSION`` for a pinned source release fetched with
``pip download --no-binary :all: --no-deps``), the files bugs are injected into and, for each, the
test files that exercise it (those tests decide FAIL_TO_PASS / PASS_TO_PASS and are what the grader
runs). ``deselect`` lists node-id prefixes left out of grading because they depend on the host
(e.g. ``six``'s moved-module tests import optional stdlib modules such as ``tkinter``).

The real libraries were chosen because their sdists ship their tests, need nothing beyond pytest,
and run in seconds: ``inflection``, ``toolz``, ``six`` and ``idna``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RepoSpec:
    """One repository and how many tasks to draw from it (see the module docstring)."""

    name: str
    source: str
    targets: dict[str, tuple[str, ...]]
    quota: int
    deselect: tuple[str, ...] = ()
    max_fail_to_pass: int = 40
    test_timeout_s: float = 120.0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def test_files(self) -> list[str]:
        return sorted({t for files in self.targets.values() for t in files})

    def describe(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "targets": {k: list(v) for k, v in sorted(self.targets.items())},
            "quota": self.quota,
            "deselect": list(self.deselect),
            "max_fail_to_pass": self.max_fail_to_pass,
        }


SEED_SPECS: tuple[RepoSpec, ...] = (
    RepoSpec("textkit", "seed:textkit", {"textkit/core.py": ("tests/test_core.py",)}, quota=4),
    RepoSpec("intervals", "seed:intervals", {"intervals/ops.py": ("tests/test_ops.py",)}, quota=4),
    RepoSpec("ministats", "seed:ministats", {"ministats/stats.py": ("tests/test_stats.py",)}, quota=4),
)

REAL_SPECS: tuple[RepoSpec, ...] = (
    RepoSpec(
        "inflection",
        "pypi:inflection==0.5.1",
        {"inflection/__init__.py": ("test_inflection.py",)},
        quota=15,
    ),
    RepoSpec(
        "toolz",
        "pypi:toolz==0.12.1",
        {
            "toolz/itertoolz.py": ("toolz/tests/test_itertoolz.py",),
            "toolz/functoolz.py": ("toolz/tests/test_functoolz.py",),
            "toolz/dicttoolz.py": ("toolz/tests/test_dicttoolz.py",),
        },
        quota=18,
    ),
    RepoSpec(
        "six",
        "pypi:six==1.16.0",
        {"six.py": ("test_six.py",)},
        quota=10,
        deselect=("test_six.py::test_move_items", "test_six.py::test_move_items_urllib"),
    ),
    RepoSpec(
        "idna",
        "pypi:idna==3.7",
        {
            "idna/core.py": ("tests/test_idna.py", "tests/test_idna_other.py"),
            "idna/codec.py": ("tests/test_idna_codec.py",),
        },
        quota=12,
    ),
)

ALL_SPECS: tuple[RepoSpec, ...] = SEED_SPECS + REAL_SPECS


def specs_by_name(names: list[str] | None) -> list[RepoSpec]:
    """The specs named in ``names`` (all of them when None); an unknown name raises ValueError."""
    if names is None:
        return list(ALL_SPECS)
    table = {s.name: s for s in ALL_SPECS}
    groups = {"seed": list(SEED_SPECS), "real": list(REAL_SPECS), "all": list(ALL_SPECS)}
    out: list[RepoSpec] = []
    for n in names:
        if n in groups:
            out.extend(s for s in groups[n] if s not in out)
        elif n in table:
            if table[n] not in out:
                out.append(table[n])
        else:
            raise ValueError(f"repos: unknown repository {n!r}; known: {sorted(table)} or seed/real/all")
    return out
