#!/usr/bin/env bash
# Start the Docker daemon for the sandbox backend, if none answers yet, and wait for it.
#
#   bash scripts/start_dockerd.sh          # idempotent: a no-op when `docker version` already answers
#
# The daemon runs with --bridge=none --iptables=false: sandboxes use network_mode=none, so no bridge or
# NAT rules are needed (and machines without iptables can still run Docker). Its log goes to
# ${FR_DOCKERD_LOG:-/tmp/fr-agents-dockerd.log}. Waits up to ${FR_DOCKERD_WAIT:-60} seconds.
set -euo pipefail

LOG=${FR_DOCKERD_LOG:-/tmp/fr-agents-dockerd.log}
WAIT=${FR_DOCKERD_WAIT:-60}

answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
  echo "start_dockerd: docker is not installed (apt-get install -y docker.io)" >&2
  exit 1
fi

if answers; then
  echo "start_dockerd: daemon already answers ($(docker version --format '{{.Server.Version}}'))"
  exit 0
fi

SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
echo "start_dockerd: starting dockerd (log: $LOG)"
# setsid + nohup: the daemon must outlive this shell and the CI step that called it.
$SUDO setsid nohup dockerd --bridge=none --iptables=false >>"$LOG" 2>&1 < /dev/null &

for ((i = 0; i < WAIT * 2; i++)); do
  if answers; then
    echo "start_dockerd: daemon answers ($(docker version --format '{{.Server.Version}}')) after ~$((i / 2)) s"
    exit 0
  fi
  sleep 0.5
done
echo "start_dockerd: dockerd did not answer within ${WAIT} s; last log lines:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
