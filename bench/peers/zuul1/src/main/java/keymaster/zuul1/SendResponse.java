package keymaster.zuul1;

import com.netflix.util.Pair;
import com.netflix.zuul.ZuulFilter;
import com.netflix.zuul.context.RequestContext;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.Locale;
import java.util.Set;
import javax.servlet.http.HttpServletResponse;

/**
 * The post filter that sends the origin's answer to the client (zuul-simple-webapp's
 * sendResponse, in Java): status, end-to-end fields, the body copied through. When routing
 * failed it answers 502, and when the origin's body fails midway, a 502 if nothing was sent
 * yet or a closed connection if some was. The origin's body is always closed, read to its end
 * or not, so that its connection goes back to the pool or is closed.
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
        try (InputStream body = ctx.getResponseDataStream()) {
            if (ctx.getThrowable() != null) {
                out.setStatus(502);
                out.setContentLength(0);
                return null;
            }
            out.setStatus(ctx.getResponseStatusCode());
            Set<String> skip = Route.hopByHop(ctx.getOriginResponseHeaders().stream()
                    .filter(h -> h.first().equalsIgnoreCase("connection"))
                    .map(Pair::second)
                    .toList());
            for (Pair<String, String> h : ctx.getOriginResponseHeaders()) {
                String name = h.first().toLowerCase(Locale.ROOT);
                if (name.equals("content-length")) {
                    out.setContentLengthLong(Long.parseLong(h.second().trim()));
                } else if (!skip.contains(name)) {
                    out.addHeader(h.first(), h.second());
                }
            }
            if (body != null) {
                OutputStream sink = out.getOutputStream();
                body.transferTo(sink);
            }
        } catch (IOException e) {
            // The origin's body failed midway (or the client left). Nothing sent yet: a 502
            // instead. Sent in part: the connection is closed, the answer visibly cut short.
            if (!out.isCommitted()) {
                out.reset();
                out.setStatus(502);
                out.setContentLength(0);
            } else {
                ctx.getRequest().setAttribute(Servlet.ABORT, e);
            }
        }
        return null;
    }
}
