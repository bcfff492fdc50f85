#!/bin/sh
# Builds the Zuul 2 bake-off peer (bench/peers/zuul2: zuul-core 2.6.9 from Maven Central) into
# bench/peers/zuul2/target/zuul2-peer.jar with its dependencies in target/lib, and prints the
# `keymaster bench --peer` argument that runs it.
set -eu
D=$(cd "$(dirname "$0")/../bench/peers/zuul2" && pwd)
(cd "$D" && mvn -q -B package -DskipTests)
echo "--peer 'zuul2=java -XX:+UseParallelGC -Xms512m -Xmx512m -XX:ActiveProcessorCount={workers} -cp $D/target/zuul2-peer.jar:$D/target/lib/* keymaster.zuul2.Main {port} {origin} {workers}'"
