package keymaster.zuul1;

import com.netflix.zuul.http.ZuulServlet;
import java.io.IOException;
import javax.servlet.ServletException;
import javax.servlet.ServletRequest;
import javax.servlet.ServletResponse;

/**
 * Zuul's servlet, and a way to fail a request whose answer is already partly sent: ZuulServlet
 * keeps every filter's failure to itself, so Tomcat would finish such an answer as if it
 * were whole. A post filter that has to abort names the failure in the request's
 * {@link #ABORT} attribute; thrown from here, it makes Tomcat close the connection.
 */
public class Servlet extends ZuulServlet {
    static final String ABORT = "keymaster.zuul1.abort";

    @Override
    public void service(ServletRequest req, ServletResponse res) throws ServletException, IOException {
        super.service(req, res);
        if (req.getAttribute(ABORT) instanceof IOException failure) {
            throw failure;
        }
    }
}
