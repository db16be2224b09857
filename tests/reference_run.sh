#!/usr/bin/env bash
# The suite's one reference run (ctest's fixture `references`, before every case that needs Python): the C++ cases
# that call Python run in record mode, writing what they would ask of it (tests/test_util.cpp); one Python process
# (tests/reference_batch.py) answers all of a round's requests; the cases whose later calls read what vit made from
# earlier answers (LATER, a gtest filter) ask again in the next round. The cases then run for real and replay their
# answers. Prints the rounds and the number of Python processes started (at most 5).
#
#   reference_run.sh ROOT PYTHON LATER EXECUTABLE FILTER [EXECUTABLE FILTER ...]
#
# ROOT is emptied first. PYTHON is the reference Python (the project's .venv); $VIT_TEST_PYTHON or $VIT_VENV override
# it as they do for the cases. Without it, Debian's /usr/bin/python3 answers what needs only the standard library or
# numpy, and the cases that need the reference libraries skip naming the reason.
set -uo pipefail
root=$1 python=$2 later=$3
shift 3
max_rounds=4
start=$(date +%s)
rm -rf "$root"
mkdir -p "$root"
log=$root/log.txt
exec > >(tee "$log") 2>&1

if [[ -n "${VIT_TEST_PYTHON:-}" ]]; then
  python=$VIT_TEST_PYTHON
elif [[ -n "${VIT_VENV:-}" ]]; then
  python=$VIT_VENV/bin/python
fi
runner=$python missing=""
if [[ ! -x "$python" ]]; then
  missing="reference libraries not installed: no $python (scripts/setup.sh makes it with VIT_SETUP_TEST_EXTRAS=1)"
  runner=/usr/bin/python3
fi
processes=0
for ((round = 1; round <= max_rounds; ++round)); do
  dir=$root/round$round
  mkdir -p "$dir"
  : >"$dir/requests.jsonl"
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i += 2)); do
    exe=${args[i]} filter=${args[i + 1]}
    if ((round > 1)); then
      # Only the LATER cases: running every case that asked something again, to find out whether it asks more,
      # cost 30-65 s a suite. A case outside LATER that asks later fails in its replay, naming the list.
      [[ -n "$later" ]] || continue
      filter="$later"
    fi
    VIT_REFERENCES=$root VIT_REFERENCE_RECORD=$dir "$exe" --gtest_filter="$filter" >"$dir/$(basename "$exe").log" 2>&1
  done
  count=$(wc -l <"$dir/requests.jsonl")
  echo "reference run: round $round: $count requests"
  ((count > 0)) || break
  if [[ ! -x "$runner" ]]; then
    echo "reference run: neither $python nor $runner exists: no reference answers"
    break
  fi
  processes=$((processes + 1))
  "$runner" "$(dirname "$0")/reference_batch.py" "$root" "$dir/requests.jsonl" --reference "$python" \
    --reference-missing "$missing" || echo "reference run: $runner $(dirname "$0")/reference_batch.py failed"
done
if [[ ! -f "$root/modules.json" ]]; then
  printf '{"python": "", "reference": "%s", "reference_missing": "%s", "modules": {}}\n' "$python" \
    "${missing:-no reference run answered (see $log)}" >"$root/modules.json"
fi
echo "reference run: $processes Python processes, $(($(date +%s) - start)) s"
if ((processes > 5)); then
  echo "reference run: more than 5 Python processes: a case asks in too many rounds" >&2
  exit 1
fi
