#!/usr/bin/env bash
# Compare the sampling path of several source trees on one GPU machine, in one device call.
#
#   benchmarks/ab_trees.sh prepare main=main fused=sampling-fused-reductions ...
#       (here, in the repository) exports each revision's src/ to .tcache/LABEL/src
#   benchmarks/ab_trees.sh run "$OUT" main fused ...
#       (on the device, carrying .tcache) compiles every label's kernels first (WARM_SHARES
#       parallel processes per label: compiling, not timing, is most of a cold run), then times
#       every label's tree in its own process with probe_sampling_split.py, twice in alternating
#       order, compares the labels' tokens and times into $OUT/compare.txt, gathers the runs'
#       logs into $OUT/runs.txt and their times into $OUT/runs.json, and drops the rest (few
#       files come back).
#
# .tcache is in .git/info/exclude; carry it with the device call (carry: [".tcache"]).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?prepare or run}
shift
case "$mode" in
  prepare)
    for spec in "$@"; do
      label=${spec%%=*}
      rev=${spec#*=}
      rm -rf ".tcache/$label"
      mkdir -p ".tcache/$label"
      git archive "$rev" src | tar -x -C ".tcache/$label"
      echo "$label: $(git rev-parse --short "$rev") -> .tcache/$label/src"
    done
    ;;
  run)
    out=${1:?the output folder}
    shift
    export PYTHONUNBUFFERED=1
    shopt -s nullglob
    shares=${WARM_SHARES:-4}
    pids=()
    for label in "$@"; do
      for ((i = 0; i < shares; i++)); do
        PYTHONPATH=".tcache/$label/src:benchmarks" python benchmarks/probe_sampling_split.py --warm "$i" "$shares" \
          > "$out/warm-$label-$i.txt" 2>&1 &
        pids+=("$!:$label-$i")
      done
    done
    for entry in "${pids[@]}"; do
      wait "${entry%%:*}" || echo "warming ${entry#*:} failed: see warm-${entry#*:}.txt in runs.txt"
    done
    echo "warmed: $(date +%T)"
    for round in 1 2; do
      for label in "$@"; do
        PYTHONPATH=".tcache/$label/src:benchmarks" python benchmarks/probe_sampling_split.py \
          "$label$round" "$out" > "$out/split-$label$round.txt" 2>&1 || echo "$label$round failed"
        echo "$label$round: $(tail -2 "$out/split-$label$round.txt")"
      done
    done
    # only the labels whose runs wrote their times are compared; the logs and cleanup follow anyway
    labels=()
    for round in 1 2; do
      for label in "$@"; do
        [[ -f "$out/split-$label$round.json" ]] && labels+=("$label$round")
      done
    done
    if ((${#labels[@]})); then
      PYTHONPATH=benchmarks python benchmarks/probe_sampling_split.py --compare "$out" "${labels[@]}" \
        | tee "$out/compare.txt" || echo "compare failed"
    fi
    for f in "$out"/split-*.txt "$out"/warm-*.txt; do echo "=== $(basename "$f")"; cat "$f"; done > "$out/runs.txt"
    python - "$out" <<'PY'
import glob, json, os, sys
runs = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "split-*.json")))}
json.dump(runs, open(os.path.join(sys.argv[1], "runs.json"), "w"), indent=1)
PY
    rm -f "$out"/tokens-*.pt "$out"/split-*.txt "$out"/split-*.json "$out"/warm-*.txt
    ;;
  *)
    echo "usage: $0 prepare LABEL=REV ... | run OUT LABEL ..." >&2
    exit 2
    ;;
esac
