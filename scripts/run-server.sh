#!/usr/bin/env bash
# What `make run` starts: linattn-server with its sessions durable in the
# user's state directory, so that a restart (kill -9, a reboot) keeps them.
#
#   scripts/run-server.sh SERVER_BINARY [FLAGS...]
#
# The directory: LINATTN_STATE_DIR (or --state-dir) when given, none for
# memory only; else $XDG_STATE_HOME/linattn, or ~/.local/state/linattn
# when XDG_STATE_HOME is unset (or not an absolute path, as the XDG Base
# Directory specification asks). Durability is the server's default,
# --durability always: one fdatasync per scheduler round or generation
# iteration, whatever the number of sessions in it (group commit), before
# anything of it is acknowledged. Flags given here override both.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 SERVER_BINARY [FLAGS...]" >&2
  exit 2
fi
server=$1
shift

if [[ -z ${LINATTN_STATE_DIR:-} ]]; then
  base=${XDG_STATE_HOME:-}
  if [[ $base != /* ]]; then
    base="${HOME:?neither XDG_STATE_HOME nor HOME is set: give LINATTN_STATE_DIR}/.local/state"
  fi
  export LINATTN_STATE_DIR="$base/linattn"
fi

exec "$server" "$@"
