#!/usr/bin/env bash
# Builds tools/eureka/keymaster-eureka.jar: a real Netflix Eureka server (Spring Cloud Netflix
# Eureka Server; versions from the spring-cloud-dependencies BOM under Spring Boot's parent,
# see pom.xml) as one runnable jar for keymaster's service-discovery tests:
#   java -Xmx256m -XX:TieredStopAtLevel=1 -jar tools/eureka/keymaster-eureka.jar --server.port=N
# The first run downloads about 90 MB from Maven Central into ~/.m2 (about a minute); later
# runs resolve everything from ~/.m2 and need no network.
set -euo pipefail
cd "$(dirname "$0")"
nice -n 10 mvn -q -B -Dstyle.color=never package -DskipTests
cp target/keymaster-eureka.jar keymaster-eureka.jar
