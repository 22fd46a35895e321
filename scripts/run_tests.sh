#!/usr/bin/env bash
# The whole suite (make test), in two pytest sessions side by side:
#   - the tests marked `measures` (they judge throughput measured in real time) one at a
#     time, at normal priority, as a user measures on a quiet machine;
#   - every other test on three workers at nice 10: they take the CPU the measuring test
#     leaves idle and yield it whenever that test wants it (a nice-10 process gets about a
#     tenth of a core that a nice-0 one also wants).
# The rest's output is printed when both have ended; the exit status is the worse one.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/python -m pytest -q)
rest_log=$(mktemp)
trap 'rm -f "$rest_log"' EXIT

nice -n 10 "${PYTEST[@]}" -n 3 -m "not measures" --durations=15 "$@" >"$rest_log" 2>&1 &
rest=$!
echo "== tests marked measures, one at a time (the rest run beside them at nice 10) =="
"${PYTEST[@]}" -n 0 -m measures --durations=10 "$@"
measures_status=$?
wait "$rest"
rest_status=$?
echo "== every other test, on three workers at nice 10 =="
cat "$rest_log"
echo "measures: exit $measures_status; the rest: exit $rest_status"
exit $((measures_status > rest_status ? measures_status : rest_status))
