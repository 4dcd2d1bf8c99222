#!/usr/bin/env bash
# Makes the TLS tests' certificates with openssl in DIR (valid two days):
#   ca.pem/ca.key           a test CA
#   server.pem/server.key   a server certificate it signed, for 127.0.0.1,
#                           ::1 and localhost
#   client.pem/client.key   a client certificate it signed (mTLS)
#   ca2.pem, server2.pem/server2.key
#                           another CA and a server certificate it signed
#                           (a certificate rotation)
#   rogue-ca.pem, rogue.pem/rogue.key
#                           a client certificate of a CA the server does not
#                           know
#
#   tests/tls/make_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"

ca() {  # NAME SUBJECT
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() {  # NAME CA SUBJECT EXTENSIONS
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -CAcreateserial -out "$1.pem" -days 2 -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
server_ext=$'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth'
client_ext='extendedKeyUsage=clientAuth'

ca ca "linattn test CA"
leaf server ca localhost "$server_ext"
leaf client ca "tenant client" "$client_ext"
ca ca2 "linattn test CA 2"
leaf server2 ca2 localhost "$server_ext"
ca rogue-ca "someone else's CA"
leaf rogue rogue-ca "rogue client" "$client_ext"
chmod 600 ./*.key
