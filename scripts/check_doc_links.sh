#!/usr/bin/env bash
# Fails when a tracked source or document names a *.md file that does not exist.
#   scripts/check_doc_links.sh [REPO_ROOT]     (run by ctest as docs_links_test)
# A reference with a folder ("docs/FORMAT.md", "../service/README.md") must exist relative to
# the citing file's folder or to the repository root; a bare name ("FORMAT.md") must be the name
# of some file in the repository. URLs (http://, https://) are not checked.
set -euo pipefail
root="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
cd "$root"

if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard)
else
  mapfile -t files < <(find . -path ./build -prune -o -type f -print | sed 's|^\./||')
fi
declare -A basenames=()
for f in "${files[@]}"; do basenames["${f##*/}"]=1; done

missing=0
checked=0
for f in "${files[@]}"; do
  case "$f" in
    *.md|*.h|*.hpp|*.cc|*.c|*.cu|*.cuh|*.txt|*.proto|*.py|*.sh|*.cmake|*.yaml|*.yml|*CMakeLists.txt) ;;
    *) continue ;;
  esac
  [[ -f "$f" ]] || continue
  # Every token ending in .md, with any URL scheme kept so it can be skipped.
  while IFS=: read -r line ref; do
    [[ -z "$ref" ]] && continue
    case "$ref" in http://*|https://*|*://*) continue ;; esac
    checked=$((checked + 1))
    dir="$(dirname "$f")"
    if [[ "$ref" == */* ]]; then
      [[ -e "$dir/$ref" || -e "$root/$ref" ]] && continue
    else
      [[ -n "${basenames[$ref]:-}" || -e "$dir/$ref" ]] && continue
    fi
    echo "$f:$line: names $ref, which does not exist" >&2
    missing=$((missing + 1))
  done < <(grep -noE '([A-Za-z][A-Za-z0-9+.-]*://)?[A-Za-z0-9_./-]*[A-Za-z0-9_-]+\.md\b' "$f" || true)
done

if (( missing > 0 )); then
  echo "check_doc_links: $missing reference(s) to missing documents" >&2
  exit 1
fi
echo "check_doc_links: $checked references to .md files, all present"
