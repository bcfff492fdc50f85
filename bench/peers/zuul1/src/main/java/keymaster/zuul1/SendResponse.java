package keymaster.zuul1;

import com.netflix.util.Pair;
import com.netflix.zuul.ZuulFilter;
import com.netflix.zuul.context.RequestContext;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import javax.servlet.http.HttpServletResponse;

/**
 * The post filter that sends the origin's answer to the client (zuul-simple-webapp's
 * sendResponse, in Java): status, end-to-end fields, the body copied through. When routing
 * failed it answers 502. Reading the body to its end gives the origin connection back to
 * the pool.
 */
public class SendResponse extends ZuulFilter {
    @Override
    public String filterType() {
        return "post";
    }

    @Override
    public int filterOrder() {
        return 1000;
    }

    @Override
    public boolean shouldFilter() {
        return true;
    }

    @Override
    public Object run() {
        RequestContext ctx = RequestContext.getCurrentContext();
        HttpServletResponse out = ctx.getResponse();
        if (ctx.getThrowable() != null) {
            out.setStatus(502);
            out.setContentLength(0);
            return null;
        }
        out.setStatus(ctx.getResponseStatusCode());
        for (Pair<String, String> h : ctx.getOriginResponseHeaders()) {
            String name = h.first().toLowerCase();
            if (name.equals("content-length")) {
                out.setContentLengthLong(Long.parseLong(h.second()));
            } else if (!Route.NOT_FORWARDED.contains(name)) {
                out.addHeader(h.first(), h.second());
            }
        }
        try (InputStream body = ctx.getResponseDataStream()) {
            if (body != null) {
                OutputStream sink = out.getOutputStream();
                body.transferTo(sink);
                sink.flush();
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return null;
    }
}
