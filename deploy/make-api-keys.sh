#!/usr/bin/env bash
# Makes an API keys file for linattn-server (--api-keys, LINATTN_API_KEYS):
# a new random key for TENANT, appended to FILE (created if missing) as its
# SHA-256 hash — the file holds no key — and the key printed once on
# stdout, for the tenant's clients (LINATTN_API_KEY, or `authorization:
# Bearer KEY`).
#
#   deploy/make-api-keys.sh FILE TENANT [admin]
#
# The file is what a Kubernetes Secret, a podman secret or a read-only
# bind mount gives the server (deploy/README.md). Quotas are fields of an
# entry: max_sessions, max_state_bytes, tokens_per_second.
set -euo pipefail
file=$1
tenant=$2
admin=false
[[ ${3:-} == admin ]] && admin=true
key=$(openssl rand -hex 32)
hash=$(printf %s "$key" | sha256sum | cut -d' ' -f1)
/usr/bin/python3 - "$file" "$tenant" "$hash" "$admin" <<'PY'
import json, os, sys
path, tenant, digest, admin = sys.argv[1:]
keys = {"keys": []}
if os.path.exists(path):
    with open(path) as f:
        keys = json.load(f)
keys["keys"].append({"sha256": digest, "tenant": tenant, "admin": admin == "true"})
with open(path + ".new", "w") as f:
    json.dump(keys, f, indent=2)
    f.write("\n")
# Hashes only: readable by the server's user inside a container.
os.chmod(path + ".new", 0o644)
os.replace(path + ".new", path)
PY
echo "$key"
