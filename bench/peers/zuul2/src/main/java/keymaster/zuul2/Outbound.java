package keymaster.zuul2;

import com.netflix.zuul.Filter;
import com.netflix.zuul.filters.FilterType;
import com.netflix.zuul.filters.http.HttpOutboundSyncFilter;
import com.netflix.zuul.message.http.HttpResponseMessage;

/** A pass-through outbound filter (zuul-core needs a filter of every type to build its chains). */
@Filter(order = 0, type = FilterType.OUTBOUND)
public class Outbound extends HttpOutboundSyncFilter {
    @Override
    public int filterOrder() {
        return 0;
    }

    @Override
    public boolean shouldFilter(HttpResponseMessage msg) {
        return false;
    }

    @Override
    public HttpResponseMessage apply(HttpResponseMessage msg) {
        return msg;
    }
}
