# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/python-test.sh: progress lines for long stages, so that
# none is silent for minutes.
#
# progress NAME LOG COMMAND...: runs COMMAND (a command or a shell function) with its output in
# LOG; while it runs, every SPARSEKV_PROGRESS_EVERY seconds (default 30), prints
#   "   NAME: <seconds so far> s, at <the last step in LOG>"
# where a step is ninja's "[n/N]" or ctest's "n/N tests". Returns COMMAND's status.
progress() {
  local name=$1 log=$2
  shift 2
  local every=${SPARSEKV_PROGRESS_EVERY:-30}
  local begin=$SECONDS ticks=0 status=0 step
  "$@" >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if ((ticks % every == 0)) && kill -0 "$pid" 2>/dev/null; then
      step=$(grep -aoE '^\[[0-9]+/[0-9]+\]|^ *[0-9]+/[0-9]+ Test' "$log" | tail -n 1 | tr -d ' ' ||
        true)
      echo "   $name: $((SECONDS - begin)) s${step:+, at ${step/Test/ tests}}"
    fi
  done
  wait "$pid" || status=$?
  return "$status"
}

# filtered LOG REGEX COMMAND...: runs COMMAND with its whole output in LOG, printing the lines that
# match REGEX as they come (pip's "Collecting" and "  Downloading ... (366.1 MB)" lines, ninja's
# "[n/N]"); on failure prints "failed (exit N): COMMAND; the end of LOG:" and LOG's last 40 lines.
# Returns COMMAND's status.
filtered() {
  local -
  set -o pipefail
  local log="$1" regex="$2"
  shift 2
  mkdir -p "$(dirname "$log")"
  local status=0
  "$@" 2>&1 | tee "$log" | { grep --line-buffered -E "$regex" || true; } || status=$?
  if ((status != 0)); then
    echo "failed (exit $status): $*; the end of $log:"
    tail -n 40 "$log"
  fi
  return "$status"
}
