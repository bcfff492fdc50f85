#!/bin/sh
# Builds the Zuul 1 on Tomcat bake-off peer (bench/peers/zuul1: zuul-core 1.3.1 from Maven Central
# in an embedded Tomcat 9) into bench/peers/zuul1/target/zuul1-peer.jar with its dependencies in
# target/lib, and prints the `keymaster bench --peer` argument that runs it.
set -eu
D=$(cd "$(dirname "$0")/../bench/peers/zuul1" && pwd)
(cd "$D" && mvn -q -B package -DskipTests)
echo "--peer 'zuul1=java -XX:+UseParallelGC -Xms512m -Xmx512m -XX:ActiveProcessorCount={workers} -cp $D/target/zuul1-peer.jar:$D/target/lib/* keymaster.zuul1.Main {port} {origin}'"
