package keymaster.zuul2;

import com.netflix.appinfo.InstanceInfo;
import com.netflix.client.config.CommonClientConfigKey;
import com.netflix.client.config.IClientConfig;
import com.netflix.loadbalancer.AbstractServerList;
import com.netflix.niws.loadbalancer.DiscoveryEnabledServer;
import java.util.ArrayList;
import java.util.List;

/**
 * `<vip>.ribbon.listOfServers` (host:port,...) as Eureka-style servers, which zuul-core 2.6.9's
 * origin code expects (it casts every server to DiscoveryEnabledServer). No Eureka involved.
 */
public class StaticServerList extends AbstractServerList<DiscoveryEnabledServer> {
    private final List<DiscoveryEnabledServer> servers = new ArrayList<>();

    @Override
    public void initWithNiwsConfig(IClientConfig config) {
        String list = String.valueOf(config.getProperty(CommonClientConfigKey.ListOfServers, ""));
        for (String s : list.split(",")) {
            s = s.trim();
            if (s.isEmpty()) {
                continue;
            }
            int colon = s.lastIndexOf(':');
            String host = s.substring(0, colon);
            int port = Integer.parseInt(s.substring(colon + 1));
            InstanceInfo info = InstanceInfo.Builder.newBuilder()
                    .setAppName("api")
                    .setInstanceId(s)
                    .setHostName(host)
                    .setIPAddr(host)
                    .setPort(port)
                    .setVIPAddress("api")
                    .setStatus(InstanceInfo.InstanceStatus.UP)
                    .build();
            servers.add(new DiscoveryEnabledServer(info, false, true));
        }
    }

    @Override
    public List<DiscoveryEnabledServer> getInitialListOfServers() {
        return servers;
    }

    @Override
    public List<DiscoveryEnabledServer> getUpdatedListOfServers() {
        return servers;
    }
}
