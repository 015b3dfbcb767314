#!/usr/bin/env bash
# Two "hosts" for the prefill->decode handoff: network namespaces NAME-a (10.251.0.1) and
# NAME-b (10.251.0.2) joined by a veth pair. Needs root and iproute2.
#
#   pd_hosts.sh up NAME        create them (fails if they exist)
#   pd_hosts.sh down NAME      delete them (and the veth pair with them)
#   pd_hosts.sh handoff BUILD  a throwaway pair: daemon A + `oscarkv pd prefill` on host a, daemon B +
#                              `oscarkv pd decode` (loading from daemon A over the veth) on host b;
#                              everything is removed on every exit path.
# Traffic stays inside the namespaces this script creates.
set -euo pipefail

ADDR_A=10.251.0.1
ADDR_B=10.251.0.2

up() {
  local n=$1 va="okv$$a" vb="okv$$b"
  ip netns add "$n-a"
  ip netns add "$n-b" || { ip netns del "$n-a"; return 1; }
  if ! { ip link add "$va" type veth peer name "$vb" &&
         ip link set "$va" netns "$n-a" && ip link set "$vb" netns "$n-b" &&
         ip -n "$n-a" addr add "$ADDR_A/24" dev "$va" && ip -n "$n-b" addr add "$ADDR_B/24" dev "$vb" &&
         ip -n "$n-a" link set "$va" up && ip -n "$n-b" link set "$vb" up &&
         ip -n "$n-a" link set lo up && ip -n "$n-b" link set lo up; }; then
    ip link del "$va" 2>/dev/null || true
    down "$n"
    return 1
  fi
  echo "host a: netns $n-a ($ADDR_A); host b: netns $n-b ($ADDR_B)"
}

down() {
  ip netns del "$1-a" 2>/dev/null || true
  ip netns del "$1-b" 2>/dev/null || true
}

# Starts oscarkvd in netns $1 on $2 (log $3); sets LISTEN to its address (from its ready line).
# Runs in this shell (not a subshell) so that DAEMON_PIDS reaches the exit trap.
start_daemon() {
  local ns=$1 addr=$2 log=$3 out=$3.out line=""
  # Plaintext gRPC and the whole-pool UCX data plane on the veth (decode reads daemon A's pool
  # over it; any peer on that link could read and write the pool): throwaway namespaces only.
  ip netns exec "$ns" "$OSCARKVD" --listen "$addr:0" --metrics-listen off --pool-mb 128 --allow-plaintext \
      --ucx-allow-unverified-rma >"$out" 2>"$log" &
  DAEMON_PIDS+=($!)
  for _ in $(seq 300); do
    line=$(grep -m1 '^oscarkvd ready' "$out" || true)
    [[ -n $line ]] && break
    sleep 0.1
  done
  [[ -n $line ]] || { echo "daemon in $ns did not start (see $log)" >&2; return 1; }
  LISTEN=$(sed -n 's/.*listen=\([^ ]*\).*/\1/p' <<<"$line")
}

handoff() {
  local build=${1:?usage: pd_hosts.sh handoff BUILD_DIR}
  local name="okvpd-sh-$$"
  OSCARKV="$build/cli/oscarkv"
  OSCARKVD="$build/service/oscarkvd"
  DAEMON_PIDS=()
  local tmp
  tmp=$(mktemp -d)
  trap 'kill ${DAEMON_PIDS[*]:-} 2>/dev/null || true; wait 2>/dev/null || true; down '"$name"'; rm -rf '"$tmp" EXIT INT TERM
  up "$name"
  local a b
  start_daemon "$name-a" "$ADDR_A" "$tmp/a.log"
  a=$LISTEN
  start_daemon "$name-b" "$ADDR_B" "$tmp/b.log"
  b=$LISTEN
  echo "daemon A $a (host a), daemon B $b (host b)"
  ip netns exec "$name-a" "$OSCARKV" pd prefill --daemon "$a" --handle demo \
      --prompt "${PROMPT:-The LIKE expression returns true if the string matches the supplied pattern.}" \
      --page-tokens 16 --sink 16 --recent 32
  ip netns exec "$name-b" "$OSCARKV" pd decode --daemon "$a" --local-daemon "$b" --handle demo \
      --tokens "${TOKENS:-32}" --page-tokens 16 --sink 16 --recent 32
}

case "${1:-}" in
  up) up "${2:?name}" ;;
  down) down "${2:?name}" ;;
  handoff) handoff "${2:-}" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
