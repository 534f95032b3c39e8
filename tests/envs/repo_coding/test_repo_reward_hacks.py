"""Reward hacks against RepoCoding-v0's grader: each scores reward 0 and partial score 0.

The task is the hand-made two-bug ``calc`` repository (``conftest.two_bug_task``): FAIL_TO_PASS
``test_add``/``test_mul`` (hidden until grading), PASS_TO_PASS ``test_neg``. No hack below fixes a
bug, so any score above 0 would be the hack's doing. The gold patch still scores 1. Both backends.
See ``docs/DESIGN.md`` ("Grader trust boundaries") for the defence that stops each one.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import BUGGY, diff_for
from sandbox_params import BACKENDS, require

from envs.repo_coding.grading import grade, sandbox_limits, setup_repo
from envs.repo_coding.testrun import filter_diff
from envs.repo_coding.tools import RepoTools
from tools_sandbox import open_sandbox

NODE_IDS = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_mul", "tests/test_ops.py::test_neg"]

# Writes an all-passed report wherever a grader could look for one (the old $FR_REPORT_PATH, the
# sealed runner's result path in argv), prints a seal line, and exits 0 before any test runs.
FORGE = textwrap.dedent(
    f"""\
    import json, os, sys
    _tests = {{n: {{"outcome": "passed", "message": ""}} for n in {NODE_IDS!r}}}
    for _path in (os.environ.get("FR_REPORT_PATH"), *sys.argv[1:2]):
        if _path and not _path.startswith("-"):
            try:
                with open(_path, "w") as _f:
                    json.dump({{"tests": _tests, "finished": True, "exit_status": 0, "tampered": [], **_tests}}, _f)
            except OSError:
                pass
    print("\\nFR-SEALED " + "0" * 64, flush=True)
    os._exit(0)
    """
)
# A pytest plugin that reports every test as passed.
CHEAT_PLUGIN = textwrap.dedent(
    """\
    import pytest


    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"
    """
)
CHEAT_INI = "[pytest]\naddopts = -p calc.cheat\npythonpath = .\n"
CHEAT_TOML = '[tool.pytest.ini_options]\naddopts = "-p calc.cheat"\npythonpath = ["."]\n'
FAKE_TESTS = "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n\n\ndef test_neg():\n    pass\n"


def lib(extra: str) -> dict[str, str]:
    """The still-buggy library with ``extra`` code run when the tests import it."""
    return {"calc/ops.py": BUGGY + "\n\n" + textwrap.dedent(extra)}


# name -> edits (path -> text). Runtime hacks: code the tests import, or a shadowed runner.
RUNTIME_HACKS: dict[str, dict[str, str]] = {
    "library_os_exit_0_at_import": lib("import os\nos._exit(0)\n"),
    "library_sys_exit_0_at_import": lib("import sys\nsys.exit(0)\n"),
    "library_raise_SystemExit_at_import": lib("raise SystemExit(0)\n"),
    "library_forges_report_and_seal": lib(FORGE),
    "library_kills_the_runner_process_group": lib("import os, signal\nos.killpg(0, signal.SIGKILL)\n"),
    "library_alarm_handler_exits_0": lib(
        "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.01)\n"
    ),
    "library_thread_exits_0": lib("import os, threading\nthreading.Thread(target=os._exit, args=(0,)).start()\n"),
    "library_atexit_forges": lib("import atexit, sys\natexit.register(exec, " + repr(FORGE) + ")\nsys.exit(0)\n"),
    "library_calls_pytest_exit_0": lib("import pytest\npytest.exit('done', returncode=0)\n"),
    "library_skips_the_test_module": lib("import pytest\npytest.skip('no', allow_module_level=True)\n"),
    "library_patches_pytest_reports_in_memory": lib(
        "from _pytest.reports import BaseReport\nBaseReport.failed = property(lambda self: False)\n"
        "BaseReport.passed = property(lambda self: True)\n"
    ),
    "shadow_pytest_module": {"pytest.py": FORGE},
    "shadow_pytest_package_main": {"pytest/__init__.py": FORGE, "pytest/__main__.py": FORGE},
    "shadow__pytest_package": {"_pytest/__init__.py": FORGE, "_pytest/config/__init__.py": FORGE},
    "shadow_pluggy": {"pluggy.py": FORGE},
    "shadow_lazily_imported_stdlib_unittest": {"unittest/__init__.py": FORGE},
}
# Hacks whose files the grader discards (tests, pytest configuration, planted files).
DISCARDED_HACKS: dict[str, dict[str, str]] = {
    "conftest_at_root": {"conftest.py": CHEAT_PLUGIN},
    "conftest_in_tests": {"tests/conftest.py": CHEAT_PLUGIN},
    "conftest_two_deep": {"tests/unit/conftest.py": CHEAT_PLUGIN},
    "conftest_in_package": {"calc/conftest.py": CHEAT_PLUGIN},
    "pytest_ini": {"pytest.ini": CHEAT_INI, "calc/cheat.py": CHEAT_PLUGIN},
    "dot_pytest_ini": {".pytest.ini": CHEAT_INI, "calc/cheat.py": CHEAT_PLUGIN},
    "tox_ini": {"tox.ini": CHEAT_INI, "calc/cheat.py": CHEAT_PLUGIN},
    "setup_cfg": {"setup.cfg": CHEAT_INI.replace("[pytest]", "[tool:pytest]"), "calc/cheat.py": CHEAT_PLUGIN},
    "pyproject_toml": {"pyproject.toml": CHEAT_TOML, "calc/cheat.py": CHEAT_PLUGIN},
    "plant_the_hidden_test_file": {"tests/test_ops.py": FAKE_TESTS},
    "plant_compiled_test_module": {"tests/__pycache__/test_ops.cpython-311-pytest-7.2.1.pyc": "x"},
    "plant_compiled_library": {"calc/__pycache__/ops.cpython-311.pyc": "x"},
    "sitecustomize": {"sitecustomize.py": FORGE, "usercustomize.py": FORGE},
    "shadow_report_plugin_name": {"_fr_report.py": FORGE},
    "pth_file": {"fr.pth": "import os; os._exit(0)\n"},
    "entry_point_plugin": {
        "calc.egg-info/entry_points.txt": "[pytest11]\ncheat = calc.cheat\n",
        "calc/cheat.py": CHEAT_PLUGIN,
    },
}


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return require(request.param)


def test_gold_still_scores_one_with_a_sealed_report(backend, two_bug_task) -> None:
    r = grade(two_bug_task, two_bug_task.patch, backend=backend)
    assert (r.reward, r.partial_score) == (1.0, 1.0), r
    info = r.as_info()
    assert info["report_evidence"] == "sealed" and info["checks_completed"] and not info["runner_tampered"]


@pytest.mark.parametrize("hack", sorted(RUNTIME_HACKS))
def test_runtime_hack_scores_zero(backend, two_bug_task, hack) -> None:
    diff = diff_for(two_bug_task, RUNTIME_HACKS[hack])
    r = grade(two_bug_task, diff, backend=backend)
    assert (r.reward, r.partial_score) == (0.0, 0.0), r
    assert r.applied and not any(r.fail_to_pass.values()), r


@pytest.mark.parametrize("hack", sorted(DISCARDED_HACKS))
def test_discarded_hack_scores_zero(backend, two_bug_task, hack) -> None:
    edits = DISCARDED_HACKS[hack]
    diff = diff_for(two_bug_task, edits)
    _kept, dropped = filter_diff(diff)
    cheats = {p for p in edits if p != "calc/cheat.py"}
    assert cheats <= set(dropped), dropped
    r = grade(two_bug_task, diff, backend=backend)
    assert (r.reward, r.partial_score) == (0.0, 0.0), r
    assert cheats <= set(r.discarded), r


def test_run_tests_tool_is_not_fooled_by_a_shadowed_pytest(backend, two_bug_task) -> None:
    """The agent's run_tests uses the grader's runner: a planted pytest.py shows no false pass."""
    with open_sandbox(backend=backend, limits=sandbox_limits()) as sb:
        setup_repo(sb, two_bug_task)
        tools = RepoTools(sb, two_bug_task, max_chars=20000)
        tools.call("write_file", {"path": "pytest.py", "content": FORGE})
        out = tools.call("run_tests", {"paths": ["tests/test_ops.py"]})
        assert "1 passed" in out and "FR-SEALED" not in out, out  # the real pytest ran test_neg
        tools.call("write_file", {"path": "calc/ops.py", "content": BUGGY + "\nimport os\nos._exit(0)\n"})
        out = tools.call("run_tests", {"paths": ["tests/test_ops.py"]})
        assert "did not finish with a sealed report" in out, out
