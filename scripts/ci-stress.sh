#!/usr/bin/env bash
# CI under load: the README's test command on a fresh clone of this checkout's HEAD, with a CPU
# hog running beside it.
#
#   scripts/ci-stress.sh [--runs N] [--hogs N] [--keep] [-- PYTEST_ARGS...]
#
#   --runs N   run N times in a row, each on a fresh clone; stop at the first failure (1)
#   --hogs N   busy processes beside the tests (one per core)
#   --keep     keep the clones (and their .venv) instead of removing them after each run
#   -- ARGS    passed to pytest through ./scripts/test.sh, e.g. `-- tests/unit`
#
# The hog's processes run at the tests' own priority, not niced: the scheduler then gives the
# tests about half of the machine, and every wait and deadline in them meets a busy host. A niced
# hog would yield the CPU whenever the tests want it, and prove little.
# Each clone bootstraps its own .venv (scripts/bootstrap.sh); pip's cache is used as it is, so a
# warm cache saves the downloads. Only committed work is tested. The hog is stopped whatever
# happens (failure, Ctrl-C, SIGTERM). Logs stay in the directory printed at the start.
set -euo pipefail

runs=1
hogs="$(nproc)"
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
    --hogs) hogs="${2:?--hogs needs a number}"; shift 2 ;;
    --keep) keep=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ci-stress: unknown argument '$1' (pytest's arguments go after --)" >&2; exit 2 ;;
  esac
done
case "$runs$hogs" in
  *[!0-9]* | "") echo "ci-stress: --runs and --hogs take whole numbers" >&2; exit 2 ;;
esac
[ "$runs" -ge 1 ] || { echo "ci-stress: --runs must be at least 1" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit="$(git -C "$root" rev-parse HEAD)"
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  echo "ci-stress: uncommitted changes in $root are not tested: a fresh clone holds commits only" >&2
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/ci-stress-XXXXXX")"
hog_pids=()

stop_hog() {
  local pid
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  hog_pids=()
}
cleanup() {
  stop_hog
  if [ "$keep" -eq 0 ]; then rm -rf "$work"/clone-*; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

echo "ci-stress: commit $(git -C "$root" log -1 --format='%h %s' "$commit" | cut -c1-80)"
echo "ci-stress: $runs run(s), $hogs hog process(es) on $(nproc) core(s); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ci-stress: logs in $work"
for ((i = 0; i < hogs; i++)); do
  sh -c 'while kill -0 "$PPID" 2>/dev/null; do :; done' &  # ends if this script is killed
  hog_pids+=("$!")
done

rows=()
failed=0
for ((run = 1; run <= runs; run++)); do
  clone="$work/clone-$run"
  log="$work/run-$run.log"
  git clone --quiet "$root" "$clone"
  git -C "$clone" checkout --quiet --detach "$commit"
  started=$SECONDS
  if (cd "$clone" && CI=true ./scripts/test.sh "$@") >"$log" 2>&1; then
    result=passed
  else
    result="FAILED (exit $?)"
    failed=1
  fi
  wall=$((SECONDS - started))
  summary="$(grep -E '[0-9]+ (passed|failed|errors?)' "$log" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')"
  echo "ci-stress: run $run/$runs $result in $(duration "$wall"): ${summary:-no pytest summary, see $log}"
  rows+=("| $(date +%F) | \`$(git -C "$root" rev-parse --short "$commit")\` | $hogs | $result | ${summary:-see log} | $(duration "$wall") |")
  if [ "$keep" -eq 0 ]; then rm -rf "$clone"; fi
  if [ "$failed" -ne 0 ]; then
    echo "ci-stress: stopping at the first failure; the end of its log:"
    tail -n 40 "$log"
    break
  fi
done
stop_hog

echo
echo "| date | commit | hog processes | result | pytest | wall time |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
