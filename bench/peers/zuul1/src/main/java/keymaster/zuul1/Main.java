package keymaster.zuul1;

import com.netflix.zuul.filters.FilterRegistry;
import com.netflix.zuul.monitoring.MonitoringHelper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;

/**
 * Zuul 1 on Tomcat (zuul-core 1.3.1, embedded Tomcat 9) as a bake-off peer, the seed's
 * baseline: `java -cp ... keymaster.zuul1.Main PORT ORIGIN [THREADS]`. One listener on
 * 127.0.0.1:PORT, Zuul's servlet on every path, one route filter to ORIGIN (host:port) and one
 * post filter that sends the answer. Blocking inbound and outbound IO: a request holds one of
 * THREADS request threads (5,000 by default, the seed's `maxThreads`) until its answer is
 * sent.
 */
public final class Main {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String origin = args[1];
        int threads = args.length > 2 ? Integer.parseInt(args[2]) : 5000;

        // zuul-core 1.x counts and traces through factories that must be set before a request:
        // no-op ones, as zuul-simple-webapp's start-up does.
        MonitoringHelper.initMocks();
        FilterRegistry.instance().put("route", new Route(origin, threads));
        FilterRegistry.instance().put("send-response", new SendResponse());

        Tomcat tomcat = new Tomcat();
        Path base = Files.createTempDirectory("zuul1-peer");
        tomcat.setBaseDir(base.toString());
        // Tomcat's work folder goes with the process (the bench stops a peer with SIGTERM).
        Runtime.getRuntime().addShutdownHook(new Thread(() -> removeTree(base)));
        // NIO, not the seed's APR connector (that needs the tomcat-native library), with the
        // seed's maxThreads, maxKeepAliveRequests and connectionTimeout; room for every
        // connection the bench opens (maxConnections, acceptCount) is ours.
        Connector connector = new Connector("org.apache.coyote.http11.Http11NioProtocol");
        connector.setPort(port);
        connector.setProperty("address", "127.0.0.1");
        connector.setProperty("maxThreads", Integer.toString(threads));
        connector.setProperty("maxKeepAliveRequests", "5000");
        connector.setProperty("connectionTimeout", "20000");
        connector.setProperty("maxConnections", "100000");
        connector.setProperty("acceptCount", "4096");
        tomcat.setConnector(connector);

        Context context = tomcat.addContext("", null);
        Tomcat.addServlet(context, "zuul", new Servlet());
        context.addServletMappingDecoded("/*", "zuul");
        tomcat.start();
        tomcat.getServer().await();
    }

    private static void removeTree(Path root) {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException | UncheckedIOException e) {
            // Left in the temporary folder: nothing else to do while the JVM exits.
        }
    }
}
