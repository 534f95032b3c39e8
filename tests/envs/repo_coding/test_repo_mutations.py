import ast

from envs.repo_coding.mutations import KINDS, find_mutations

SRC = '''"""Module docstring."""
TABLE = [1, 2, 3]


def f(xs, n, flag=True):
    """Doc."""
    # é non-ascii comment before code: offsets are UTF-8 bytes
    total = 0
    for i in range(1, n):
        if xs[i] > 0 and flag:
            total += xs[i] * 2
    if total == 0:
        return None
    return pow(total, 2) - len("ab")
'''


def test_every_kind_is_found_and_each_result_is_valid_python():
    muts = find_mutations(SRC)
    assert {m.kind for m in muts} == set(KINDS)
    original = ast.dump(ast.parse(SRC))
    for m in muts:
        new = m.apply(SRC)
        assert ast.dump(ast.parse(new)) != original, m
        # one local edit: everything outside [start, end) is untouched
        raw, out = SRC.encode(), new.encode()
        assert out[: m.start] == raw[: m.start]
        assert out[len(out) - (len(raw) - m.end) :] == raw[m.end :]


def test_module_level_code_and_docstrings_are_never_mutated():
    for m in find_mutations(SRC):
        new = m.apply(SRC)
        assert new.splitlines()[:2] == SRC.splitlines()[:2]
        assert '"""Doc."""' in new


def test_specific_edits():
    edits = {(m.kind, m.apply(SRC)) for m in find_mutations(SRC)}
    texts = [t for _, t in edits]
    assert any("xs[i] >= 0" in t for t in texts)  # comparison swapped
    assert any("xs[i] > 0 or flag" in t for t in texts)  # boolean operator swapped
    assert any("range(2, n)" in t for t in texts)  # off by one
    assert any("pow(2, total)" in t for t in texts)  # arguments swapped
    assert any(
        "flag=True" in t and "    if total == 0:\n        return None" not in t for t in texts
    )  # branch removed
    assert any('len("a")' in t for t in texts)  # string constant changed
    assert any("total + len" not in t and "pow(total, 2) + len" in t for t in texts)  # minus -> plus


def test_deterministic():
    assert find_mutations(SRC) == find_mutations(SRC)
