#!/usr/bin/env bash
# Set up everything (idempotent, cached) and run the full test suite.
#   bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --all || { echo "test.sh: set-up failed" >&2; exit 1; }
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
python3 -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests, which counts as a failure here" >&2
  exit 1
fi
exit "$rc"
