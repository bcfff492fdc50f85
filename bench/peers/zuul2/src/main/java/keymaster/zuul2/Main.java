package keymaster.zuul2;

import com.netflix.config.ConfigurationManager;
import com.netflix.netty.common.accesslog.AccessLogPublisher;
import com.netflix.netty.common.metrics.EventLoopGroupMetrics;
import com.netflix.netty.common.status.ServerStatusManager;
import com.netflix.spectator.api.DefaultRegistry;
import com.netflix.spectator.api.Registry;
import com.netflix.zuul.BasicRequestCompleteHandler;
import com.netflix.zuul.DefaultFilterFactory;
import com.netflix.zuul.StaticFilterLoader;
import com.netflix.zuul.context.ZuulSessionContextDecorator;
import com.netflix.zuul.netty.server.BaseServerStartup;
import com.netflix.zuul.netty.server.DefaultEventLoopConfig;
import com.netflix.zuul.netty.server.DirectMemoryMonitor;
import com.netflix.zuul.netty.server.Server;
import com.netflix.zuul.origins.BasicNettyOriginManager;
import com.netflix.netty.common.channel.config.ChannelConfig;
import com.netflix.zuul.netty.server.NamedSocketAddress;
import com.netflix.zuul.netty.server.ZuulServerChannelInitializer;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.group.ChannelGroup;
import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;

/**
 * Zuul 2 (zuul-core 2.6.9) as a bake-off peer: `java -cp ... keymaster.zuul2.Main PORT ORIGIN
 * WORKERS`. One listener on 127.0.0.1:PORT (plain HTTP/1.1), one route to ORIGIN (host:port),
 * WORKERS event loops. No Eureka, no Guice: the pieces zuul-sample's injector would build.
 */
public final class Main {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String origin = args[1];
        int workers = args.length > 2 ? Integer.parseInt(args[2]) : 1;
        var cfg = ConfigurationManager.getConfigInstance();
        cfg.setProperty("zuul.server.port.main", port);
        cfg.setProperty("zuul.server.netty.threads.worker", workers);
        cfg.setProperty("zuul.server.netty.threads.acceptor", 1);
        // The origin: a static server list, no Eureka.
        cfg.setProperty("api.ribbon.NIWSServerListClassName", StaticServerList.class.getName());
        cfg.setProperty("api.ribbon.listOfServers", origin);
        cfg.setProperty("api.ribbon.DeploymentContextBasedVipAddresses", "api");
        // Origin connection pool: keep connections instead of reopening them. zuul-core 2.6.9 reads
        // these two; by default it keeps 4 idle connections per event loop (PerServerWaterline) and
        // closes the rest, so most requests opened a new origin connection.
        cfg.setProperty("api.ribbon.PerServerWaterline", 100000);
        cfg.setProperty("api.ribbon.MaxRequestsPerConnection", 1000000);
        cfg.setProperty("api.ribbon.MaxConnectionsPerHost", 100000);
        cfg.setProperty("api.ribbon.ConnectTimeout", 5000);
        cfg.setProperty("api.ribbon.ReadTimeout", 10000);
        cfg.setProperty("zuul.origin.api.concurrency.protect.enabled", false);
        cfg.setProperty("server.connection.max.requests", 1000000);
        cfg.setProperty("server.http.request.headers.read.timeout.enabled", false);
        cfg.setProperty("zuul.server.netty.socket.force_nio", false);
        cfg.setProperty("eureka.shouldFetchRegistry", false);
        cfg.setProperty("eureka.registration.enabled", false);

        Registry registry = new DefaultRegistry();
        var filters = new StaticFilterLoader(new DefaultFilterFactory(), Set.of(Route.class, Outbound.class));
        var startup = new BaseServerStartup(
                new ServerStatusManager(null) {
                    @Override // no Eureka: nothing to tell
                    public void localStatus(com.netflix.appinfo.InstanceInfo.InstanceStatus status) {}
                },
                filters,
                new ZuulSessionContextDecorator(new BasicNettyOriginManager(registry)),
                (filter, status) -> {},
                new BasicRequestCompleteHandler(),
                registry,
                new DirectMemoryMonitor(registry),
                new EventLoopGroupMetrics(registry),
                new DefaultEventLoopConfig(workers, 1),
                null,
                null,
                new AccessLogPublisher("ACCESS", (ch, req) -> "-")) {
            @Override
            protected Map<NamedSocketAddress, ChannelInitializer<?>> chooseAddrsAndChannels(ChannelGroup clients) {
                Map<NamedSocketAddress, ChannelInitializer<?>> map = new HashMap<>();
                var addr = new InetSocketAddress("127.0.0.1", port);
                String metricId = String.valueOf(port);
                ChannelConfig channelConfig = defaultChannelConfig(metricId);
                ChannelConfig deps = defaultChannelDependencies(metricId);
                map.put(new NamedSocketAddress("http", addr),
                        new ZuulServerChannelInitializer(metricId, channelConfig, deps, clients));
                return map;
            }
        };
        startup.init();
        Server server = startup.server();
        server.start();
        System.out.println("zuul2 listening on 127.0.0.1:" + port + " -> " + origin + " (" + workers + " event loops)");
        server.awaitTermination();
    }
}
