#!/usr/bin/env bash
# One call on the GPU machine: every test marked gpu or compile (nvcc, NVRTC), the sanitizers, a
# benchmark. Logs and JSON go to $OUT.
# Usage (from the repo root there): [BENCH=attention|kvpr] [NAME=file stem, default $BENCH]
# bash benchmarks/device_run.sh [bench options...]; TESTS overrides the test paths (default: all
# of tests/), SKIP_TESTS=1 / SKIP_SANITIZER=1 skip those parts. The panels' tests need ipywidgets,
# plotly and anywidget with their dependencies (traitlets, IPython), which the device image lacks:
# carry their wheels in .whl/ (benchmarks/README.md says how); FlashInfer's decode needs those of
# flashinfer_wheels.sh, in .whl-flashinfer/. The tree with both folders exceeds the device tool's
# 64 MiB carry: carry the one a call needs (FlashInfer's GPU tests then run in a call of their
# own, TESTS=tests/kernels/test_flashinfer_peer.py). A module that fails to import is counted as
# an error in the summary; the other tests still run.
# RERECORD_H100 / RERECORD_H200="part ...": after the checks, benchmarks/rerecord.py re-records
# those parts of the machine whose GPU this is (a call for one kind may lend the other), each
# recording the checks, within RERECORD_BUDGET seconds (default 300; the call's limit less the
# tests and sanitizers), packed into $OUT/rr.tgz after every part, its progress in rerecord.log.
# Back on the development machine, `tar xzf rr.tgz` gives rerecorded/, and
# `python benchmarks/rerecord.py --machine M --take rerecorded` files it into the repository.
# Provenance: where the tree travelled without .git, set KVLAB_GIT_REVISION and KVLAB_GIT_DIRTY
# (kvlab/bench/env.py).
# NOTE: the device returns at most 8 files from $OUT. This script leaves up to seven: device.log
# (GPU, the tests' last lines, sanitizers, the re-recording's summary), tests.log (pytest's whole
# output), gpu_checks.json, rr.tgz and rerecord.log, $NAME.log (the report and progress) and
# $NAME.json (or, when the run was cut short, the checkpoint $NAME_partial.json).
set -uo pipefail
OUT=${OUT:-/tmp/kvlab-out}
mkdir -p "$OUT"
log=$OUT/device.log
wheels=$(compgen -G ".whl/*.whl"; compgen -G ".whl-flashinfer/*.whl")  # those carried
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi  # PATH: the wheels' commands (ninja, which FlashInfer's JIT runs)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$log"
python3 -c "from kvlab.bench.env import git_state; print(git_state())" 2>&1 | tee -a "$log"

checks=()  # the summary lines of the checks, recorded in the benchmark's result (gpu_checks)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # SIGINT at the limit: pytest stops as on Ctrl-C and still reports the failures so far (where
  # it is killed before its summary, the count below comes from its progress line)
  timeout -s INT -k 30 ${TEST_TIMEOUT:-420} python3 -m pytest -q -rfE -m "gpu or compile" \
    -p no:cacheprovider --import-mode=importlib --continue-on-collection-errors ${TESTS:-tests} \
    > "$OUT/tests.log" 2>&1
  tail -40 "$OUT/tests.log" | tee -a "$log" > "$OUT/tests.tail"
  summary=$(grep -E "[0-9]+ (passed|failed|errors?|skipped|deselected)" "$OUT/tests.tail" \
            | tail -1 | tr -d "=")
  grep -q "KeyboardInterrupt" "$OUT/tests.tail" && summary="$summary, stopped at the limit"
  if [ -z "$summary" ]; then  # killed before pytest's summary: count its progress characters
    progress=$(grep -E '^[.FEsxX]+( +\[ *[0-9]+%\])?$' "$OUT/tests.log" | sed 's/ *\[.*//' \
               | tr -d '\n')
    summary="no summary, cut short after ${#progress} tests: $(tr -cd . <<< "$progress" \
      | wc -c) passed, $(tr -cd FE <<< "$progress" | wc -c) failed or errors"
  fi
  checks+=(tests "$summary (${TESTS:-tests})")
  rm -f "$OUT/tests.tail"
fi
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool" >> "$log"
    timeout ${SANITIZER_TIMEOUT:-90} compute-sanitizer --tool $tool \
      python3 benchmarks/sanitize_cases.py 2>&1 | tail -20 > "$OUT/$tool.tail"
    cat "$OUT/$tool.tail" >> "$log"
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.tail" | tail -1 \
              | sed 's/^=* *//')
    checks+=("$tool" "${summary:-no summary: cut short or not run}")
    rm -f "$OUT/$tool.tail"
    tail -3 "$log"
  done
fi
if [ "${#checks[@]}" -gt 0 ]; then
  KVLAB_GPU_CHECKS=$(python3 -c 'import json, sys; a = sys.argv[1:]
print(json.dumps(dict(zip(a[::2], a[1::2]))))' "${checks[@]}")
  export KVLAB_GPU_CHECKS
  echo "$KVLAB_GPU_CHECKS" > "$OUT/gpu_checks.json"  # for benchmarks/rerecord.py --gpu-checks
  echo "gpu_checks: $KVLAB_GPU_CHECKS" | tee -a "$log"
fi
if [ -n "${RERECORD_H100:-}${RERECORD_H200:-}" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) machine=h200 parts=${RERECORD_H200:-} ;;
    *H100*) machine=h100 parts=${RERECORD_H100:-} ;;
    *) machine="" parts="" ;;
  esac
  if [ -n "$parts" ]; then
    # (KVLAB_GPU_CHECKS, exported above, reaches every part; rerecord.log grows as it runs)
    rm -rf /tmp/rerecorded
    python3 benchmarks/rerecord.py --machine "$machine" --run $parts \
      --budget "${RERECORD_BUDGET:-300}" --out /tmp/rerecorded --pack "$OUT/rr.tgz" \
      > "$OUT/rerecord.log" 2>&1
    tail -30 "$OUT/rerecord.log" | tee -a "$log"
  else
    echo "RERECORD_H100/RERECORD_H200: no parts for this GPU" | tee -a "$log"
  fi
fi
if [ "$#" -gt 0 ]; then
  bench=${BENCH:-attention} name=${NAME:-${BENCH:-attention}}
  timeout "${BENCH_TIMEOUT:-300}" python3 -m kvlab bench "$bench" --json "$OUT/$name.json" \
    --checkpoint "$OUT/${name}_partial.json" "$@" > "$OUT/$name.log" 2>&1
  [ -f "$OUT/$name.json" ] && rm -f "$OUT/${name}_partial.json"
  tail -60 "$OUT/$name.log"
fi
