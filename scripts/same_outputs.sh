#!/usr/bin/env bash
# Are this checkout's outputs byte-identical to those of an earlier commit? For a change
# that should move code, not behaviour (a refactor).
#
#   bash scripts/same_outputs.sh REF
#
# With REF's code: a diagnose, a collect with its report, an RL loop with fixed lengths, a
# two-trial sweep and a two-trial goodput sweep on the simulator, each into its own folder. Then both REF's code and this checkout's rebuild
# every output from those saved results (`autotune report`, and the terminal summaries),
# and print every command's --help; any byte that differs is shown and the exit is 1.
# Measured figures move from run to run, so each job runs once; what is compared is what
# each version makes of the same saved results.
set -euo pipefail
ref=${1:?usage: scripts/same_outputs.sh REF}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$here" worktree add --detach -q "$work/base" "$ref"
trap 'git -C "$here" worktree remove --force "$work/base"; rm -rf "$work"' EXIT

jobs() {  # the saved results, made once with REF's code
    cd "$work/base"
    local run=(env PYTHONPATH="$work/base" "$python" -m autotune)
    "${run[@]}" diagnose --synthetic 200 --min-s 1 --max-s 4 -q --output-dir "$work/saved/diagnose" >/dev/null
    "${run[@]}" collect --synthetic 300 --parallelism 32 -q --output-dir "$work/saved/collect" --report >/dev/null
    cat >"$work/study.yaml" <<'YAML'
name: same
target: {kind: sim, args: [--time-scale, "0.05"]}
workload: {synthetic: {num_tasks: 200, output_tokens: [64, 8]}}
search_space: {parallelism: {low: 4, high: 64}, max_num_seqs: {choices: [8, 32]}}
probe: {min_s: 0.5, max_s: 2}
budget: {trials: 2}
YAML
    "${run[@]}" sweep "$work/study.yaml" --studies-dir "$work/studies" --output-dir "$work/saved/sweep" -q >/dev/null
    "${run[@]}" loop --synthetic 64 --num-repeats 4 --batch-groups 4 --steps 3 --mode async \
        --max-ahead 8 --output-tokens 64,0 --train-s 0.2 --sim-arg=--time-scale=0.05 -q \
        --output-dir "$work/saved/loop" >/dev/null
    cat >"$work/goodput.yaml" <<'YAML'
name: goodput
target: {kind: sim, args: [--time-scale, "0.05"]}
workload: {synthetic: {num_tasks: 64, output_tokens: [64, 16]}, num_repeats: 4, batch: {batch_groups: 4}}
search_space: {max_num_seqs: {choices: [8, 32]}}
objective: {metric: informative_groups_per_s}
probe: {steps: 2}
budget: {trials: 2, validate_rollouts: 0}
YAML
    "${run[@]}" sweep "$work/goodput.yaml" --studies-dir "$work/studies" --output-dir "$work/saved/goodput" -q >/dev/null
}

outputs() {  # every output rebuilt by the code at $1, into $2 (paths made relative)
    local src=$1 out=$2
    mkdir -p "$out"
    cd "$src"
    for kind in diagnose collect sweep loop goodput; do
        cp -r "$work/saved/$kind" "$out/$kind"
        rm -f "$out/$kind"/index.html "$out/$kind"/trials.csv "$out/$kind"/recommendation.*
        PYTHONPATH="$src" "$python" -m autotune report "$out/$kind" | sed "s#$out/##" >"$out/$kind.printed"
    done
    PYTHONPATH="$src" "$python" - "$out" >"$out/terminal.txt" <<'PY'
import sys
from pathlib import Path

from autotune.report import terminal

try:  # the results' reader, before and after the house by concept
    from autotune.results.saved import load_result
except ImportError:
    from autotune.results import load_result

out = Path(sys.argv[1])
print(terminal.diagnose_text(load_result(out / "diagnose")))
print(terminal.collect_summary_text(load_result(out / "collect").summary))
for name in ("sweep", "goodput"):
    sweep = load_result(out / name)
    try:  # the objective words the summary, after the house by concept
        from autotune.sweep.objectives import objective_for
    except ImportError:
        from autotune.sweep.job import recommend

        print(terminal.sweep_text(sweep, recommend(sweep), Path("reports/same")))
    else:
        objective = objective_for(sweep.metric)
        rec = objective.recommend(sweep)
        print(terminal.sweep_text(sweep, rec, Path("reports/same"), objective))
print(terminal.loop_summary_text(load_result(out / "loop").summary))
PY
    local command
    for command in "" collect diagnose sweep report merge "bench run" "bench compare" \
        "bench ab" "bench update-baseline" "sim serve"; do
        # shellcheck disable=SC2086
        COLUMNS=100 PYTHONPATH="$src" "$python" -m autotune $command --help \
            >"$out/help-${command// /-}.txt" 2>&1 || true
    done
}

jobs
outputs "$work/base" "$work/before"
outputs "$here" "$work/after"
if diff -r "$work/before" "$work/after"; then
    echo "every output is byte-identical to $ref's ($(find "$work/after" -type f | wc -l) files)"
else
    exit 1
fi
