import pytest

from envs.repo_coding.builder import hide_tests, qualname_of
from envs.repo_coding.protected import filter_diff, is_protected_path
from envs.repo_coding.testrun import partial_score


@pytest.mark.parametrize(
    "path,protected",
    [
        ("tests/test_x.py", True),
        ("test_six.py", True),
        ("pkg/tests/helpers.py", True),
        ("pkg/foo_test.py", True),
        ("conftest.py", True),
        ("sub/conftest.py", True),
        ("pytest.ini", True),
        ("setup.cfg", True),
        ("pyproject.toml", True),
        (".pytest.ini", True),
        ("tox.ini", True),
        ("pkg/__pycache__/mod.cpython-311.pyc", True),
        ("mod.pyc", True),
        ("evil.pth", True),
        ("pkg.egg-info/entry_points.txt", True),
        ("pkg-1.0.dist-info/entry_points.txt", True),
        ("pytest.py", False),  # a shadowed runner is not discarded: the sealed runner ignores it
        ("six.py", False),
        ("toolz/itertoolz.py", False),
        ("pkg/testing_utils.py", False),
    ],
)
def test_protected_paths(path, protected):
    assert is_protected_path(path) is protected


DIFF = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/tests/test_mod.py b/tests/test_mod.py
deleted file mode 100644
--- a/tests/test_mod.py
+++ /dev/null
@@ -1 +0,0 @@
-def test_a(): pass
diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import pytest
"""


def test_filter_diff_drops_tests_and_config():
    kept, dropped = filter_diff(DIFF)
    assert dropped == ["tests/test_mod.py", "conftest.py"]
    assert kept.startswith("diff --git a/pkg/mod.py") and "+x = 2" in kept
    assert "test_mod" not in kept and "conftest" not in kept


def test_partial_score_rule():
    assert partial_score(3, 3, True) == 1.0
    assert partial_score(1, 2, True) == 0.5
    assert partial_score(1, 2, False) == 0.25
    assert partial_score(2, 2, False) == 0.5
    assert partial_score(0, 4, True) == 0.0
    with pytest.raises(ValueError):
        partial_score(0, 0, True)


TESTS = """import pytest


@pytest.mark.parametrize("x", [1, 2])
def test_a(x):
    assert x


def test_b():
    pass


class TestC:
    def test_only(self):
        pass


class TestD:
    def test_keep(self):
        pass

    def test_drop(self):
        pass
"""


def test_hide_tests_cuts_functions_methods_and_keeps_classes_valid():
    out = hide_tests(TESTS, {("test_a",), ("TestC", "test_only"), ("TestD", "test_drop")})
    assert out is not None
    assert "def test_a" not in out and "parametrize" not in out
    assert "def test_b" in out and "def test_keep" in out
    assert "def test_only" not in out and "def test_drop" not in out
    assert "class TestC:\n    pass" in out
    compile(out, "t.py", "exec")


def test_hide_tests_refuses_unknown_names():
    assert hide_tests(TESTS, {("test_missing",)}) is None


def test_qualname_of_strips_parameters():
    assert qualname_of("tests/t.py::TestX::test_y[a-b::c]") == ("tests/t.py", ("TestX", "test_y"))
    assert qualname_of("t.py::test_z") == ("t.py", ("test_z",))
