package keymaster.zuul1;

import com.netflix.zuul.ZuulFilter;
import com.netflix.zuul.context.RequestContext;
import com.netflix.zuul.exception.ZuulException;
import java.io.IOException;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import javax.servlet.http.HttpServletRequest;
import org.apache.http.Header;
import org.apache.http.HttpHost;
import org.apache.http.HttpResponse;
import org.apache.http.client.HttpClient;
import org.apache.http.client.config.RequestConfig;
import org.apache.http.entity.InputStreamEntity;
import org.apache.http.impl.client.HttpClients;
import org.apache.http.impl.conn.PoolingHttpClientConnectionManager;
import org.apache.http.message.BasicHttpEntityEnclosingRequest;
import org.apache.http.message.BasicHttpRequest;

/**
 * The one route: every request to the origin through a pooled Apache HttpClient (the blocking
 * client Zuul 1's host routing used), the calling request thread waiting for the answer. The
 * client's Host is kept; nothing is added (no X-Forwarded-*, Via or request id).
 */
public class Route extends ZuulFilter {
    /**
     * Hop-by-hop fields (with those a Connection field names), the framing the client sets
     * again, and Expect (Tomcat has answered a 100-continue already).
     */
    static final Set<String> NOT_FORWARDED = Set.of("connection", "keep-alive", "proxy-connection",
            "te", "trailer", "transfer-encoding", "upgrade", "content-length", "expect");

    private final HttpHost origin;
    private final HttpClient client;

    public Route(String origin, int threads) {
        int colon = origin.lastIndexOf(':');
        this.origin = new HttpHost(origin.substring(0, colon), Integer.parseInt(origin.substring(colon + 1)));
        // One pooled origin connection per request thread at most: client churn never becomes
        // origin churn.
        var pool = new PoolingHttpClientConnectionManager();
        pool.setMaxTotal(threads);
        pool.setDefaultMaxPerRoute(threads);
        // Zuul 2's peer's origin timeouts: 5 s to connect, 10 s for each read.
        var timeouts = RequestConfig.custom()
                .setConnectTimeout(5_000)
                .setSocketTimeout(10_000)
                .setConnectionRequestTimeout(10_000)
                .build();
        this.client = HttpClients.custom()
                .setConnectionManager(pool)
                .setDefaultRequestConfig(timeouts)
                .disableCookieManagement()
                .disableRedirectHandling()
                .disableAutomaticRetries()
                .disableContentCompression()
                .build();
    }

    @Override
    public String filterType() {
        return "route";
    }

    @Override
    public int filterOrder() {
        return 10;
    }

    @Override
    public boolean shouldFilter() {
        return true;
    }

    @Override
    public Object run() throws ZuulException {
        RequestContext ctx = RequestContext.getCurrentContext();
        HttpServletRequest in = ctx.getRequest();
        String uri = in.getRequestURI() + (in.getQueryString() == null ? "" : "?" + in.getQueryString());
        try {
            BasicHttpRequest out;
            long length = in.getContentLengthLong();
            String te = in.getHeader("transfer-encoding");
            boolean chunked = te != null && te.toLowerCase(Locale.ROOT).contains("chunked");
            if (length >= 0 || chunked) {
                var withBody = new BasicHttpEntityEnclosingRequest(in.getMethod(), uri);
                withBody.setEntity(new InputStreamEntity(in.getInputStream(), chunked ? -1 : length));
                out = withBody;
            } else {
                out = new BasicHttpRequest(in.getMethod(), uri);
            }
            Set<String> skip = hopByHop(Collections.list(in.getHeaders("connection")));
            for (String name : Collections.list(in.getHeaderNames())) {
                if (!skip.contains(name.toLowerCase(Locale.ROOT))) {
                    for (String value : Collections.list(in.getHeaders(name))) {
                        out.addHeader(name, value);
                    }
                }
            }
            HttpResponse answer = client.execute(origin, out);
            ctx.setResponseStatusCode(answer.getStatusLine().getStatusCode());
            for (Header h : answer.getAllHeaders()) {
                ctx.addOriginResponseHeader(h.getName(), h.getValue());
            }
            if (answer.getEntity() != null) {
                ctx.setResponseDataStream(answer.getEntity().getContent());
            }
            return null;
        } catch (IOException e) {
            throw new ZuulException(e, 502, "origin: " + e.getMessage());
        }
    }

    /** NOT_FORWARDED and the fields a message's Connection values name. */
    static Set<String> hopByHop(List<String> connection) {
        Set<String> skip = new HashSet<>(NOT_FORWARDED);
        for (String value : connection) {
            for (String token : value.split(",")) {
                skip.add(token.trim().toLowerCase(Locale.ROOT));
            }
        }
        return skip;
    }
}
