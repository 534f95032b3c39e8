"""Grading in a fresh sandbox: gold 1, empty 0, test edits gain nothing, partial fixes score partially."""

import pytest
from conftest import ALL_TESTS, BUGGY, FIXED, diff_for
from sandbox_params import BACKENDS, require

from envs.repo_coding.grading import grade
from envs.repo_coding.task import load_tasks

CHEAT_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome = "passed"
"""


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return require(request.param)


def test_gold_scores_one_and_empty_scores_zero(backend, seed_tasks_dir):
    task = load_tasks(seed_tasks_dir)[0]
    gold = grade(task, task.patch, backend=backend)
    assert (gold.reward, gold.partial_score) == (1.0, 1.0), gold
    assert all(gold.fail_to_pass.values()) and gold.pass_to_pass_passed == gold.pass_to_pass_total
    empty = grade(task, "", backend=backend)
    assert (empty.reward, empty.partial_score) == (0.0, 0.0), empty
    assert empty.pass_to_pass_passed == empty.pass_to_pass_total  # the bug breaks only FAIL_TO_PASS


def test_editing_or_deleting_tests_gains_nothing(backend, seed_tasks_dir):
    task = load_tasks(seed_tasks_dir)[0]
    test_file = task.visible_test_files[0]
    # Delete the visible tests, plant a conftest that reports every test as passed, and write the
    # hidden tests' names as trivially passing tests: all of it is discarded.
    fake = "".join(f"def {nid.split('::')[-1].split('[')[0]}():\n    pass\n\n\n" for nid in task.FAIL_TO_PASS)
    cheat = diff_for(
        task,
        {test_file: fake, "conftest.py": CHEAT_CONFTEST, "pytest.ini": "[pytest]\naddopts = -p no:python\n"},
    )
    r = grade(task, cheat, backend=backend)
    assert (r.reward, r.partial_score) == (0.0, 0.0), r
    assert set(r.discarded) == {test_file, "conftest.py", "pytest.ini"}
    # ...and they do not cost a real fix anything either.
    gold_and_delete = diff_for(task, {test_file: None}, patches=(task.patch,))
    r = grade(task, gold_and_delete, backend=backend)
    assert r.reward == 1.0 and r.discarded == [test_file], r


def test_partial_fix_gets_partial_score(backend, two_bug_task):
    t = two_bug_task
    assert t.patch and "test_add" in t.test_patch
    one = grade(t, diff_for(t, {"calc/ops.py": BUGGY.replace("a - b", "a + b")}), backend=backend)
    assert (one.reward, one.partial_score) == (0.0, 0.5), one
    broken_neg = FIXED.replace("return -a", "return a")
    both_but_regress = grade(t, diff_for(t, {"calc/ops.py": broken_neg}), backend=backend)
    assert (both_but_regress.reward, both_but_regress.partial_score) == (0.0, 0.5), both_but_regress
    one_and_regress = BUGGY.replace("a - b", "a + b").replace("return -a", "return a")
    r = grade(t, diff_for(t, {"calc/ops.py": one_and_regress}), backend=backend)
    assert (r.reward, r.partial_score) == (0.0, 0.25), r
    full = grade(t, diff_for(t, {"calc/ops.py": FIXED, "tests/test_ops.py": ALL_TESTS}), backend=backend)
    assert (full.reward, full.partial_score) == (1.0, 1.0), full


def test_a_diff_that_does_not_apply_scores_zero(backend, two_bug_task):
    bad = (
        "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n"
        "+++ b/calc/ops.py\n@@ -1,1 +1,1 @@\n-nope\n+x\n"
    )
    r = grade(two_bug_task, bad, backend=backend)
    assert r.reward == 0.0 and r.partial_score == 0.0 and not r.applied and "apply" in r.error
