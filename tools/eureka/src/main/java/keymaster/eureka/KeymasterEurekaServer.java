package keymaster.eureka;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.netflix.eureka.server.EnableEurekaServer;

/** A standalone Eureka server for keymaster's integration tests (see application.properties). */
@SpringBootApplication
@EnableEurekaServer
public class KeymasterEurekaServer {
    public static void main(String[] args) {
        SpringApplication.run(KeymasterEurekaServer.class, args);
    }
}
