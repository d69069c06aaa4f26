#!/usr/bin/env bash
# Test certificates for zccd's peer service (mutual TLS), with openssl:
#
#   make_test_certs.sh DIR [NODE...]
#
# writes into DIR the cluster's CA (ca.pem, ca.key), for each NODE (default:
# node-a node-b) NODE.pem and NODE.key signed by that CA, and an outsider:
# rogue-ca.pem and rogue.pem / rogue.key, a node certificate signed by another
# CA. Every node certificate names localhost, 127.0.0.1 and the node's own
# name (for namespaces with their own addresses, add them as NODE=IP: the IP
# joins its names). EC P-256 keys, valid for a day: for tests only.
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR [NODE[=IP]...]}
shift
nodes=("$@")
((${#nodes[@]})) || nodes=(node-a node-b)
mkdir -p "$dir"
cd "$dir"

new_ca() {  # NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.pem" 2>/dev/null
}

new_node() {  # NAME CA IP
  local name=$1 ca=$2 ip=${3:-}
  local san="DNS:localhost,DNS:$name,IP:127.0.0.1${ip:+,IP:$ip}"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -days 1 \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san") \
    -out "$name.pem" 2>/dev/null
  rm -f "$name.csr"
}

new_ca ca
for n in "${nodes[@]}"; do
  new_node "${n%%=*}" ca "$([[ $n == *=* ]] && echo "${n#*=}")"
done
new_ca rogue-ca
new_node rogue rogue-ca
chmod 600 ./*.key
