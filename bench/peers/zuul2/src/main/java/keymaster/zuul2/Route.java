package keymaster.zuul2;

import com.netflix.zuul.Filter;
import com.netflix.zuul.filters.FilterType;
import com.netflix.zuul.filters.endpoint.ProxyEndpoint;
import com.netflix.zuul.filters.http.HttpInboundSyncFilter;
import com.netflix.zuul.message.http.HttpRequestMessage;

/** The one route: every request to the origin VIP `api` (the stub), through ProxyEndpoint. */
@Filter(order = 0, type = FilterType.INBOUND)
public class Route extends HttpInboundSyncFilter {
    @Override
    public int filterOrder() {
        return 0;
    }

    @Override
    public boolean shouldFilter(HttpRequestMessage msg) {
        return true;
    }

    @Override
    public HttpRequestMessage apply(HttpRequestMessage msg) {
        msg.getContext().setEndpoint(ProxyEndpoint.class.getCanonicalName());
        msg.getContext().setRouteVIP("api");
        return msg;
    }
}
