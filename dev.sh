#!/usr/bin/env bash
# lakesink developer entry point. On a fresh machine it installs everything first.
#
#   ./dev.sh demo [args]   set up, then run `lakesink demo` (local broker -> ./lake)
#   ./dev.sh test [args]   set up, then run the whole test suite (pytest args pass through)
#   ./dev.sh setup         only set up (Python venv, JVM jars)
set -euo pipefail
cd "$(dirname "$0")"

cmd="${1:-help}"
shift || true
case "$cmd" in
  setup) exec bash scripts/setup.sh ;;
  demo)
    bash scripts/setup.sh
    exec .venv/bin/lakesink demo "$@" ;;
  test)
    bash scripts/setup.sh
    exec .venv/bin/python -m pytest "$@" ;;
  *)
    sed -n '2,7p' "$0"; exit 2 ;;
esac
