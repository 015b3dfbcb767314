#!/usr/bin/env bash
# client_no_launchers_test: the libraries an engine links (oscarkv::client, liboscarkv_c.so, as
# built and as installed) carry no process launchers or crash helpers: no LocalDaemon,
# NetnsHosts, PeerProcess, Subprocess, KillAtStage or MaybeDie defined in them, and no call of
# fork/vfork/exec*/posix_spawn*/kill/raise (those live in oscarkv::testing and util's
# oscarkv::subprocess, which the product libraries do not link).
#   no_launchers_check.sh LIB...
set -uo pipefail
[[ $# -gt 0 ]] || { echo "usage: no_launchers_check.sh LIB..." >&2; exit 2; }
command -v nm > /dev/null || { echo "FAIL: nm (binutils) not found" >&2; exit 1; }
status=0
for lib in "$@"; do
  [[ -f $lib ]] || { echo "FAIL: $lib does not exist" >&2; status=1; continue; }
  # nm of a static archive prints every member; of a shared library its symbol tables.
  defined=$(nm -C --defined-only "$lib" 2> /dev/null)
  [[ -n $defined ]] || { echo "FAIL: nm found no symbols in $lib" >&2; status=1; continue; }
  bad=$(grep -E 'LocalDaemon|NetnsHosts|PeerProcess|oscarkv::Subprocess|KillAtStage|MaybeDie' \
          <<< "$defined" | head -5)
  if [[ -n $bad ]]; then
    echo "FAIL: $lib defines test-only launchers:" >&2
    echo "$bad" >&2
    status=1
  fi
  calls=$( (nm -u "$lib"; nm -D --undefined-only "$lib") 2> /dev/null |
          awk '{print $NF}' | sed 's/@.*//' |
          grep -xE 'fork|vfork|execv|execve|execvp|execvpe|execl|execlp|execle|posix_spawnp?|kill|raise' |
          sort -u | tr '\n' ' ')
  if [[ -n $calls ]]; then
    echo "FAIL: $lib calls $calls(process launch / signal helpers)" >&2
    status=1
  fi
  [[ $status -eq 0 ]] && echo "ok: $lib ($(wc -l <<< "$defined") defined symbols, no launchers)"
done
exit $status
