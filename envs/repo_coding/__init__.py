"""RepoCoding-v0: repository-level coding tasks in a sandbox, hidden tests, partial-progress reward.

Modules: :mod:`.task` (SWE-bench task format, JSONL/parquet loader), :mod:`.mutations` (AST bug
injection), :mod:`.specs` and :mod:`.builder` (the offline task builder behind
``fr-agents repo-tasks build``), :mod:`.testrun` (pytest report plugin, protected paths, the score
rule), :mod:`.grading` (fresh-sandbox grading), :mod:`.tools` and :mod:`.env` (the episode).
"""
