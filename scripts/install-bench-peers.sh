#!/usr/bin/env bash
# Installs what `ordo bench kv` runs beside ordo-kv, from Debian 12's
# packages: redis-server and redis-benchmark (redis-tools), etcd
# (etcd-server), ZooKeeper (zookeeper, with a Java runtime), and protoc
# (protobuf-compiler), which the etcd client crate needs to build
# `--features peers`. Then:
#   cargo run --release --features peers -- bench kv --ycsb
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server redis-tools etcd-server zookeeper protobuf-compiler
# The benchmark starts its own servers on loopback; Debian's service
# units are not needed (and would hold the default ports).
for unit in redis-server etcd zookeeper; do
  $SUDO systemctl disable --now "$unit" >/dev/null 2>&1 || true
done
echo "installed: $(redis-server --version | cut -d' ' -f3), etcd $(etcd --version | head -1 | awk '{print $3}'), zookeeper $(ls /usr/share/java/zookeeper.jar)"
