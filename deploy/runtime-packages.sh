#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given binaries link (ldd, then
# dpkg -S), one a line, sorted: what a runtime image must install for them to start.
#   deploy/runtime-packages.sh [--skip PREFIX]... BINARY...
# Fails when a library is not found, or belongs to no installed package. --skip leaves out
# libraries under PREFIX (e.g. /usr/local/cuda: a CUDA build's runtime, not a Debian package).
set -euo pipefail
skips=()
while [[ "${1:-}" == --skip ]]; do skips+=("$2"); shift 2; done
(($#)) || { echo "usage: $0 [--skip PREFIX]... BINARY..." >&2; exit 2; }
out=$(ldd "$@")
if grep -q "not found" <<<"$out"; then
  echo "$0: unresolved libraries:" >&2
  grep "not found" <<<"$out" >&2
  exit 1
fi
declare -A owner
libs=()
candidates=()
for lib in $(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$out" | sort -u); do
  skip=0
  for s in "${skips[@]}"; do [[ "$lib" == "$s"* ]] && skip=1; done
  ((skip)) && continue
  libs+=("$lib")
  real=$(realpath "$lib")
  # dpkg knows a file by the path its package installed: on a merged-/usr system the /lib or the
  # /usr/lib spelling, or the target of an alternatives link (libblas.so.3).
  candidates+=("$lib" "$real" "/usr${lib#/usr}" "${lib#/usr}" "/usr${real#/usr}" "${real#/usr}")
done
while IFS= read -r line; do
  pkg=${line%%: *}
  owner[${line#*: }]=${pkg%%:*}
done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)
for lib in "${libs[@]}"; do
  real=$(realpath "$lib")
  found=""
  for p in "$lib" "$real" "/usr${lib#/usr}" "${lib#/usr}" "/usr${real#/usr}" "${real#/usr}"; do
    [[ -n "${owner[$p]:-}" ]] && { found=${owner[$p]}; break; }
  done
  [[ -n "$found" ]] || { echo "$0: no installed package holds $lib" >&2; exit 1; }
  echo "$found"
done | sort -u
