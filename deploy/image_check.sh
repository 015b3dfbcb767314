#!/usr/bin/env bash
# What of the container image (deploy/Dockerfile) can be checked without a container runtime
# (CI has none): the runtime stage's package list derived from the built binaries resolves to
# Debian packages with an install candidate, the smoke commands the image build runs succeed,
# and .dockerignore keeps build outputs, virtualenvs and .git out of the build context.
#   deploy/image_check.sh OSCARKVD OSCARKV
set -euo pipefail
cd "$(dirname "$0")/.."
(($# == 2)) || { echo "usage: $0 OSCARKVD OSCARKV" >&2; exit 2; }
fail=0
# A CUDA build links the toolkit's runtime from /usr/local/cuda; the image is built without CUDA.
pkgs=$(deploy/runtime-packages.sh --skip /usr/local/cuda "$1" "$2")
echo "runtime packages: $(tr '\n' ' ' <<<"$pkgs")"
# One apt-cache call for all: "<package>:" lines, each followed by its "Candidate:" line.
while read -r p cand; do
  if [[ -z "$cand" || "$cand" == "(none)" ]]; then
    echo "FAIL $p has no install candidate"; fail=1
  fi
done < <(apt-cache policy $pkgs | awk '/^[^ ].*:$/ {p = substr($1, 1, length($1) - 1)}
                                      /Candidate:/ {print p, $2}')
[[ $(apt-cache policy $pkgs | grep -c 'Candidate:') == $(wc -w <<<"$pkgs") ]] \
  || { echo "FAIL apt-cache does not know every runtime package"; fail=1; }
# Libraries the runtime image must have for the binaries to start (the old image lacked them).
for want in libcpp-httplib0.11 libgrpc++1.51 libucx0 libyaml-cpp0.7; do
  grep -qx "$want" <<<"$pkgs" || { echo "FAIL expected $want among the runtime packages"; fail=1; }
done
"$1" --version | grep -q '^oscarkvd [0-9]' || { echo "FAIL oscarkvd --version"; fail=1; }
"$2" --help > /dev/null || { echo "FAIL oscarkv --help exited $?"; fail=1; }
for pattern in .git build 'build*' .venv '**/.venv' '**/CMakeCache.txt' '**/CMakeFiles'; do
  grep -qxF -- "$pattern" .dockerignore || { echo "FAIL .dockerignore lacks $pattern"; fail=1; }
done
grep -q '^USER 65532' deploy/Dockerfile || { echo "FAIL the image does not run as uid 65532"; fail=1; }
# The default command must not serve the network unauthenticated (issue 24: it was plaintext on
# 0.0.0.0): no --allow-plaintext / --tls-allow-unauthenticated-clients, no wildcard listen.
cmd=$(grep '^CMD' deploy/Dockerfile || true)
if [[ -z "$cmd" ]] || grep -qE 'allow-plaintext|allow-unauthenticated|0\.0\.0\.0|"::"' <<<"$cmd"; then
  echo "FAIL the image's default CMD serves the network without mTLS: $cmd"; fail=1
fi
((fail)) && { echo "FAILED"; exit 1; }
echo "PASSED: image inputs"
