#!/usr/bin/env bash
# bench_{service,transfer}_cli_test: `oscarkv bench service|transfer` keep their flag set and
# their --json key list (bench/cli_contract/<bench>_flags.txt, <bench>_json_keys.txt). A
# benchmark that adds a flag or a key updates the list in the same commit; one that loses or
# renames one fails here. Runs each benchmark once with small sizes (seconds).
#   check.sh service|transfer <oscarkv> <contract dir>
set -euo pipefail
bench=$1 cli=$2 dir=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$cli" bench "$bench" --help > "$work/help.txt"
grep -o '^  --[a-z0-9-]*' "$work/help.txt" | sed 's/^ *//' > "$work/flags.txt"
if ! diff -u "$dir/${bench}_flags.txt" "$work/flags.txt"; then
  echo "FAIL: oscarkv bench $bench --help lists other flags than $dir/${bench}_flags.txt" >&2
  exit 1
fi

case $bench in
  service)
    "$cli" bench service --json --duration-s 0.2 --batch 4 --lookup-keys 4 --rate 500 \
      --clients 1,2 --pool-mb 64 > "$work/out.json" 2> "$work/err.txt" ||
      { cat "$work/err.txt" >&2; echo "FAIL: bench service exited $?" >&2; exit 1; } ;;
  transfer)
    "$cli" bench transfer --json --transports tcp --batch-pages 4 --bw-pages 8 --reps 1 \
      --handoff-tokens 2048 --bf16-distinct 4 --port $((20000 + RANDOM % 20000)) \
      > "$work/out.json" 2> "$work/err.txt" ||
      { cat "$work/err.txt" >&2; echo "FAIL: bench transfer exited $?" >&2; exit 1; } ;;
  *) echo "usage: check.sh service|transfer <oscarkv> <contract dir>" >&2; exit 2 ;;
esac

# Every key path of the document, one a line, sorted; list elements as "[]" (their union).
python3 - "$work/out.json" > "$work/keys.txt" <<'PY'
import json, sys
def paths(o, prefix=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield prefix + k
            yield from paths(v, prefix + k + ".")
    elif isinstance(o, list):
        for v in o:
            yield from paths(v, prefix + "[].")
print("\n".join(sorted(set(paths(json.load(open(sys.argv[1])))))))
PY
if ! diff -u "$dir/${bench}_json_keys.txt" "$work/keys.txt"; then
  echo "FAIL: oscarkv bench $bench --json has other keys than $dir/${bench}_json_keys.txt" >&2
  exit 1
fi
echo "oscarkv bench $bench: $(wc -l < "$work/flags.txt") flags and $(wc -l < "$work/keys.txt") JSON keys as listed"
