//! One failing case per validation rule, each asserting the exact key and line reported.

mod rule_support;

use rule_support::{errors, one, BASE};

#[test]
fn base_is_valid() {
    assert!(errors(BASE).is_empty());
}

#[test]
fn at_least_one_listener() {
    let text = BASE.replace(
        "[[listeners]]\nname = \"main\"\naddress = \"127.0.0.1:8080\"\n",
        "",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].key, "listeners");
    assert_eq!(errs[0].line, None);
    assert!(errs[0]
        .message
        .contains("expected at least one [[listeners]]"));
}

#[test]
fn listener_names_and_addresses_unique() {
    one(
        "[[listeners]]\nname = \"main\"\naddress = \"127.0.0.1:8090\"\n",
        "listeners[1].name",
        13,
        "already used by listeners[0]",
    );
    one(
        "[[listeners]]\nname = \"other\"\naddress = \"127.0.0.1:8080\"\n",
        "listeners[1].address",
        14,
        "already used by listeners[0]",
    );
    one(
        "[[listeners]]\nname = \"\"\naddress = \"127.0.0.1:8090\"\n",
        "listeners[1].name",
        13,
        "non-empty",
    );
    one(
        "[[listeners]]\nname = \"x\"\naddress = \"127.0.0.1:9901\"\n",
        "listeners[1].address",
        14,
        "admin.listen",
    );
}

#[test]
fn listener_fields() {
    let l = "[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:8090\"\n";
    one(
        &format!("{l}trusted_proxies = [\"10.0.0.0/8\", \"::1\", \"10.0.0.0/33\"]\n"),
        "listeners[1].trusted_proxies[2]",
        15,
        "expected e.g. \"10.0.0.0/8\"",
    );
    one(
        &format!("{l}request_id_header = \"x request id\"\n"),
        "listeners[1].request_id_header",
        15,
        "not a valid HTTP header name",
    );
    one(
        &format!("{l}header_read_timeout = \"0s\"\n"),
        "listeners[1].header_read_timeout",
        15,
        "greater than zero",
    );
    one(
        &format!("{l}send_timeout = \"0s\"\n"),
        "listeners[1].send_timeout",
        15,
        "greater than zero",
    );
    one(
        &format!("{l}max_headers = 0\n"),
        "listeners[1].max_headers",
        15,
        "greater than zero",
    );
}

#[test]
fn route_name_and_cluster() {
    one(
        "[[routes]]\nname = \"r\"\ncluster = \"c\"\n",
        "routes[1].name",
        13,
        "already used by routes[0]",
    );
    one(
        "[[routes]]\nname = \" \"\ncluster = \"c\"\n",
        "routes[1].name",
        13,
        "non-empty",
    );
    one(
        "[[routes]]\nname = \"s\"\ncluster = \"nope\"\n",
        "routes[1].cluster",
        14,
        "unknown cluster \"nope\"; expected one of: c",
    );
    // A missing cluster points at the route's header.
    one(
        "[[routes]]\nname = \"s\"\n",
        "routes[1].cluster",
        12,
        "missing cluster",
    );
}

#[test]
fn route_paths() {
    one(
        "match = { path_prefix = \"/a\", path_exact = \"/b\" }\n",
        "routes[0].match.path_exact",
        12,
        "at most one of path_prefix, path_exact, path_regex",
    );
    one(
        "match.path_prefix = \"api\"\n",
        "routes[0].match.path_prefix",
        12,
        "must start with \"/\"",
    );
    one(
        "[routes.match]\npath_exact = \"x\"\n",
        "routes[0].match.path_exact",
        13,
        "must start with \"/\"",
    );
    one(
        "match = { path_regex = \"^/(a\" }\n",
        "routes[0].match.path_regex",
        12,
        "invalid regular expression",
    );
}

#[test]
fn route_methods_hosts_headers() {
    one(
        "match.methods = [\"GET\", \"GE T\"]\n",
        "routes[0].match.methods[1]",
        12,
        "not an HTTP method token",
    );
    one(
        "match.methods = [\"get\"]\n",
        "routes[0].match.methods[0]",
        12,
        "expected \"GET\"",
    );
    one(
        "match.host = \"*.*.example.com\"\n",
        "routes[0].match.host",
        12,
        "expected an exact host",
    );
    one(
        "match.host = \"example.com:80\"\n",
        "routes[0].match.host",
        12,
        "port",
    );
    one(
        "[routes.match.headers]\n\"x-ok\" = \"1\"\n\"bad name\" = \"1\"\n",
        "routes[0].match.headers.\"bad name\"",
        14,
        "not a valid HTTP header name",
    );
    one(
        "[routes.request_headers.set]\nx-a = \"line\\nbreak\"\n",
        "routes[0].request_headers.set.x-a",
        13,
        "not a valid HTTP header value",
    );
    one(
        "response_headers = { add = { \"x:y\" = \"1\" } }\n",
        "routes[0].response_headers.add.\"x:y\"",
        12,
        "not a valid HTTP header name",
    );
    one(
        "request_headers.remove = [\"x-ok\",\n  \"x(bad)\"]\n",
        "routes[0].request_headers.remove[1]",
        13,
        "not a valid HTTP header name",
    );
}

#[test]
fn route_rewrites() {
    one(
        "match.path_prefix = \"/a\"\nrewrite = { strip_prefix = \"/a\", replace_prefix = \"/b\" }\n",
        "routes[0].rewrite.replace_prefix",
        13,
        "at most one of strip_prefix, replace_prefix, replace_path",
    );
    one(
        "rewrite.replace_prefix = \"/b\"\n",
        "routes[0].rewrite.replace_prefix",
        12,
        "expected match.path_prefix to be set",
    );
    one(
        "rewrite.replace_path = \"b\"\n",
        "routes[0].rewrite.replace_path",
        12,
        "must start with \"/\"",
    );
}

#[test]
fn route_host_policy() {
    one(
        "host_policy = \"fixed\"\n",
        "routes[0].host_policy",
        12,
        "needs fixed_host",
    );
    one(
        "fixed_host = \"a.example\"\n",
        "routes[0].fixed_host",
        12,
        "only used with host_policy = \"fixed\"",
    );
    one(
        "host_policy = \"fixed\"\nfixed_host = \"\"\n",
        "routes[0].fixed_host",
        13,
        "not usable as a Host header",
    );
    assert!(errors(&format!(
        "{BASE}host_policy = \"fixed\"\nfixed_host = \"api.internal:81\"\n"
    ))
    .is_empty());
}

#[test]
fn route_limits_and_timeouts() {
    one(
        "max_body_size = 0\n",
        "routes[0].max_body_size",
        12,
        "greater than zero",
    );
    one(
        "request_timeout = \"0ms\"\n",
        "routes[0].request_timeout",
        12,
        "greater than zero",
    );
    one(
        "read_timeout = \"0s\"\n",
        "routes[0].read_timeout",
        12,
        "greater than zero",
    );
    one(
        "client_body_timeout = \"0s\"\n",
        "routes[0].client_body_timeout",
        12,
        "greater than zero",
    );
    one(
        "request_buffering = \"yes\"\n",
        "routes[0].request_buffering",
        12,
        "invalid type",
    );
    assert!(errors(&format!(
        "{BASE}client_body_timeout = \"5s\"\nrequest_buffering = true\n"
    ))
    .is_empty());
}

/// A listener's connection limits: `0` and `"0s"` turn them off; a negative count or a
/// malformed age is refused at its key and line.
#[test]
fn listener_connection_limits() {
    let l = "[[listeners]]\nname = \"second\"\naddress = \"127.0.0.1:8090\"\n";
    one(
        &format!("{l}max_requests_per_connection = -1\n"),
        "listeners[1].max_requests_per_connection",
        15,
        "invalid value",
    );
    one(
        &format!("{l}max_connection_age = \"soon\"\n"),
        "listeners[1].max_connection_age",
        15,
        "duration",
    );
    for ok in [
        "max_requests_per_connection = 0\nmax_connection_age = \"0s\"\n",
        "max_requests_per_connection = 100\nmax_connection_age = \"10m\"\n",
    ] {
        assert!(errors(&format!("{BASE}{l}{ok}")).is_empty(), "{ok}");
    }
}

#[test]
fn clusters() {
    one(
        "[[clusters]]\nname = \"c\"\nservers = [{ address = \"127.0.0.1:1\" }]\n",
        "clusters[1].name",
        13,
        "already used by clusters[0]",
    );
    one(
        "[[clusters]]\nname = \"\"\nservers = [{ address = \"127.0.0.1:1\" }]\n",
        "clusters[1].name",
        13,
        "non-empty",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = []\n",
        "clusters[1].servers",
        14,
        "at least one",
    );
    one(
        "[[clusters]]\nname = \"d\"\n",
        "clusters[1].servers",
        12,
        "at least one",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [\n  { address = \"a.internal:80\" },\n  { address = \"a.internal\" },\n]\n",
        "clusters[1].servers[1].address",
        16,
        "expected \"host:port\"",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:70000\" }]\n",
        "clusters[1].servers[0].address",
        14,
        "not a port",
    );
    one(
        "[[clusters]]\nname = \"d\"\n[[clusters.servers]]\naddress = \"a:1\"\nweight = 0\n",
        "clusters[1].servers[0].weight",
        16,
        "expected 1 to 10000",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\", weight = 10001 }]\n",
        "clusters[1].servers[0].weight",
        14,
        "expected 1 to 10000",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\" }]\nconnect_timeout = 0\n",
        "clusters[1].connect_timeout",
        15,
        "greater than zero",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\" }]\nresponse_header_timeout = \"0s\"\n",
        "clusters[1].response_header_timeout",
        15,
        "greater than zero",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\" }]\nread_timeout = \"0s\"\n",
        "clusters[1].read_timeout",
        15,
        "greater than zero",
    );
    one(
        "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\" }]\npool = { max_connections = 10, max_idle = 11 }\n",
        "clusters[1].pool.max_idle",
        15,
        "expected at most max_connections",
    );
    // max_connections = 0 means unlimited: any max_idle is fine; unused clusters are fine.
    assert!(errors(&format!(
        "{BASE}[[clusters]]\nname = \"d\"\nservers = [{{ address = \"[::1]:1\" }}]\npool = {{ max_connections = 0, max_idle = 11 }}\n"
    ))
    .is_empty());
}

#[test]
fn server_and_access_log() {
    one(
        "[server]\ndrain_timeout = 0\n",
        "server.drain_timeout",
        13,
        "greater than zero",
    );
    one(
        "[access_log]\npath = \"\"\n",
        "access_log.path",
        13,
        "must not be empty",
    );
    one("[server]\nvia = \"\"\n", "server.via", 13, "Via header");
}

#[test]
fn three_paths_reported_once() {
    one(
        "match = { path_prefix = \"/a\", path_exact = \"/b\", path_regex = \"c\" }\n",
        "routes[0].match.path_exact",
        12,
        "path_prefix and path_exact and path_regex are all set",
    );
}

/// A second listener (listeners[1]) starting at line 12; its TLS keys start at line 15.
fn tls_listener(keys: &str) -> String {
    format!("[[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:8443\"\n{keys}")
}

#[test]
fn listener_tls() {
    let certs = "certificates = [{ cert = \"c.pem\", key = \"k.pem\" }]";
    assert!(errors(&format!(
        "{BASE}{}",
        tls_listener(&format!(
            "tls = {{ {certs}, alpn = [\"http/1.1\", \"h2\"], min_version = \"1.3\", client_auth = {{ ca = \"ca.pem\", required = false, forward_header = \"x-client-cert\" }} }}\n"
        ))
    ))
    .is_empty());
    one(
        &tls_listener("[listeners.tls]\n"),
        "listeners[1].tls.certificates",
        15,
        "no certificates",
    );
    one(
        &tls_listener("[listeners.tls]\ncertificates = [{ cert = \"\", key = \"k.pem\" }]\n"),
        "listeners[1].tls.certificates[0].cert",
        16,
        "must not be empty",
    );
    one(
        &tls_listener(&format!(
            "[listeners.tls]\n{certs}\nalpn = [\"h2\", \"spdy/3\"]\n"
        )),
        "listeners[1].tls.alpn[1]",
        17,
        "not a supported ALPN protocol",
    );
    one(
        &tls_listener(&format!(
            "protocol = \"http1\"\n[listeners.tls]\n{certs}\nalpn = [\"h2\"]\n"
        )),
        "listeners[1].tls.alpn[0]",
        18,
        "protocol is \"http1\"",
    );
    one(
        &tls_listener(&format!("protocol = \"h2c\"\n[listeners.tls]\n{certs}\n")),
        "listeners[1].tls",
        16,
        "cleartext",
    );
    one(
        &tls_listener(&format!(
            "[listeners.tls]\n{certs}\nclient_auth = {{ ca = \"ca.pem\", forward_header = \"bad header\" }}\n"
        )),
        "listeners[1].tls.client_auth.forward_header",
        17,
        "not a valid HTTP header name",
    );
    // protocol = "http1" with the default ALPN offers only http/1.1: valid.
    assert!(errors(&format!(
        "{BASE}{}",
        tls_listener(&format!("protocol = \"http1\"\ntls = {{ {certs} }}\n"))
    ))
    .is_empty());
    let errs = errors(&format!(
        "{BASE}{}",
        tls_listener("[listeners.tls]\nmin_version = \"1.1\"\n")
    ));
    // The missing certificates are reported too: a type error hides nothing else.
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!(errs[0].key, "listeners[1].tls.certificates", "{errs:?}");
    assert_eq!(errs[1].line, Some(16), "{errs:?}");
    assert!(errs[1].message.contains("1.2"), "{errs:?}");
}

#[test]
fn lua_and_filter_body_rules() {
    one("\n[lua]\ndir = \"\"\n", "lua.dir", 14, "must not be empty");
    one(
        "\n[lua]\npoll_interval = \"1ms\"\n",
        "lua.poll_interval",
        14,
        "too short",
    );
    one(
        "\n[lua]\ninstruction_budget = 10\n",
        "lua.instruction_budget",
        14,
        "too small",
    );
    one(
        "\n[lua]\nmemory_limit = \"64KiB\"\n",
        "lua.memory_limit",
        14,
        "too small",
    );
    one(
        "\n[lua]\nhttp_timeout = \"0s\"\n",
        "lua.http_timeout",
        14,
        "greater than zero",
    );
    one(
        "\n[lua]\nhttp_max_body = 0\n",
        "lua.http_max_body",
        14,
        "greater than zero",
    );
    one(
        "\n[lua]\nhttp_max_timeout = \"2s\"\nhttp_timeout = \"3s\"\n",
        "lua.http_timeout",
        15,
        "longer than http_max_timeout (\"2s\")",
    );
    one(
        "\n[lua]\nhttp_max_timeout = \"0s\"\n",
        "lua.http_max_timeout",
        14,
        "greater than zero",
    );
    one(
        "\n[lua]\nhttp_ca_file = \" \"\n",
        "lua.http_ca_file",
        14,
        "must not be empty",
    );
    one(
        "\n[lua]\nhttp_pool_idle_timeout = \"1ms\"\n",
        "lua.http_pool_idle_timeout",
        14,
        "too short",
    );
    one(
        "\n[lua]\nhttp_pool_max_idle = 5000\n",
        "lua.http_pool_max_idle",
        14,
        "too large",
    );
    one(
        "\n[lua]\nmax_call_time = \"0s\"\n",
        "lua.max_call_time",
        14,
        "too short",
    );
    one(
        "\n[lua]\nshared_dict_size = \"64KiB\"\n",
        "lua.shared_dict_size",
        14,
        "too small",
    );
    one(
        "\n[lua]\nshared_max_value = 0\n",
        "lua.shared_max_value",
        14,
        "between 1 byte and shared_dict_size / 32",
    );
    // A value must fit one shard's share: 32 MiB / 32 = 1 MiB.
    one(
        "\n[lua]\nshared_dict_size = \"32MiB\"\nshared_max_value = \"2MiB\"\n",
        "lua.shared_max_value",
        15,
        "(1048576 bytes, one shard's share)",
    );
    assert!(errors(&format!(
        "{BASE}\n[lua]\nshared_dict_size = \"32MiB\"\nshared_max_value = \"1MiB\"\n\
         max_call_time = \"50ms\"\nhttp_allow_admin = true\n"
    ))
    .is_empty());
    one(
        "\n[filter_body]\nmax_request = 0\n",
        "filter_body.max_request",
        14,
        "between",
    );
    one(
        "\n[filter_body]\nmax_response = \"2GiB\"\n",
        "filter_body.max_response",
        14,
        "between",
    );
    assert!(errors(&format!(
        "{BASE}\n[lua]\ndir = \"filters\"\nwatch = false\n"
    ))
    .is_empty());
}

#[test]
fn route_upgrade() {
    assert!(errors(&format!(
        "{BASE}upgrade = {{ websocket = false, protocols = [\"my-proto/2\"], idle_timeout = \"30s\" }}\n"
    ))
    .is_empty());
    one(
        "upgrade = { protocols = [\"ok\", \"bad proto\"] }\n",
        "routes[0].upgrade.protocols[1]",
        12,
        "not an upgrade protocol token",
    );
    one(
        "upgrade = { idle_timeout = \"0s\" }\n",
        "routes[0].upgrade.idle_timeout",
        12,
        "greater than zero",
    );
    one(
        "[routes.upgrade]\nwebsocket = true\nidle_timeout = \"0s\"\n",
        "routes[0].upgrade.idle_timeout",
        14,
        "greater than zero",
    );
}

#[test]
fn listener_proxy_protocol() {
    let l = "[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:8090\"\n";
    assert!(errors(&format!(
        "{l}proxy_protocol = \"any\"\nproxy_protocol_from = [\"10.0.0.0/8\", \"192.0.2.7\"]\n"
    ))
    .is_empty());
    one(
        &format!("{l}proxy_protocol = \"v2\"\n"),
        "listeners[1].proxy_protocol",
        15,
        "needs proxy_protocol_from",
    );
    one(
        &format!("{l}proxy_protocol = \"v1\"\nproxy_protocol_from = [\"10.0.0.0/33\"]\n"),
        "listeners[1].proxy_protocol_from[0]",
        16,
        "not an IP address or CIDR block",
    );
    assert!(!errors(&format!("{l}proxy_protocol = \"v3\"\n")).is_empty());
}

#[test]
fn cluster_proxy_protocol() {
    let text = BASE.replace("[[routes]]", "proxy_protocol = \"any\"\n\n[[routes]]");
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].key, "clusters[0].proxy_protocol");
    assert_eq!(errs[0].line, Some(9));
    assert!(
        errors(&BASE.replace("[[routes]]", "proxy_protocol = \"v2\"\n\n[[routes]]")).is_empty()
    );
}

#[test]
fn health_check_transports() {
    let d = "[[clusters]]\nname = \"d\"\nservers = [{ address = \"a:1\" }]\n";
    // gRPC speaks HTTP/2: not on an HTTP/1.1 cluster.
    one(
        &format!("{d}health_check = {{ kind = \"grpc\" }}\n"),
        "clusters[1].health_check.kind",
        15,
        "the cluster's protocol is \"http1\"",
    );
    // A service name without gRPC.
    one(
        &format!("{d}health_check = {{ path = \"/h\", grpc_service = \"svc\" }}\n"),
        "clusters[1].health_check.grpc_service",
        15,
        "service name is for gRPC checks",
    );
    // A gRPC check asks no path.
    one(
        &format!("{d}protocol = \"h2\"\nhealth_check = {{ kind = \"grpc\", path = \"/h\" }}\n"),
        "clusters[1].health_check.path",
        16,
        "not a path",
    );
    one(
        &format!("{d}health_check = {{ kind = \"tcp\" }}\n"),
        "clusters[1].health_check.kind",
        15,
        "unknown variant",
    );
    // What can work: gRPC on h2 (cleartext) or auto over TLS; an HTTP check on every
    // transport (h2, TLS, PROXY protocol).
    for ok in [
        "protocol = \"h2\"\nhealth_check = { kind = \"grpc\", grpc_service = \"pkg.Svc\" }\n",
        "protocol = \"auto\"\ntls = {}\nhealth_check = { kind = \"grpc\" }\n",
        "protocol = \"h2\"\nhealth_check = { path = \"/healthz\" }\n",
        "tls = { sni = \"a.internal\" }\nproxy_protocol = \"v2\"\nhealth_check = {}\n",
    ] {
        let errs = errors(&format!("{BASE}{d}{ok}"));
        assert!(errs.is_empty(), "{ok}: {errs:?}");
    }
}

#[test]
fn listener_path_policy() {
    let l = "[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:8090\"\n";
    let ok = format!("{BASE}{l}path = {{ merge_slashes = false, escaped_slashes = \"keep\", forward = \"raw\" }}\n");
    assert!(errors(&ok).is_empty());
    let bad = errors(&format!(
        "{BASE}{l}[listeners.path]\nescaped_slashes = \"decode\"\n"
    ));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].key, "listeners[1].path.escaped_slashes");
    assert_eq!(bad[0].line, Some(16));
    let typo = errors(&format!("{BASE}{l}path = {{ merge_slash = true }}\n"));
    assert_eq!(typo.len(), 1, "{typo:?}");
    assert!(typo[0].key.starts_with("listeners[1].path"), "{typo:?}");
}

#[test]
fn admin_fields() {
    one(
        "[admin]\nheader_read_timeout = \"0s\"\n",
        "admin.header_read_timeout",
        13,
        "greater than zero",
    );
    one(
        "[admin]\nidle_timeout = \"0s\"\n",
        "admin.idle_timeout",
        13,
        "greater than zero",
    );
    one(
        "[admin]\nmax_connections = 0\n",
        "admin.max_connections",
        13,
        "greater than zero",
    );
    one(
        "[admin]\ntoken = \"short\"\n",
        "admin.token",
        13,
        "at least 16 characters",
    );
    one(
        "[admin]\ntoken = \"with a space 0123456789\"\n",
        "admin.token",
        13,
        "visible ASCII",
    );
    one(
        "[admin]\ntoken = \"0123456789abcdef\"\ntoken_env = \"KEYMASTER_TEST_ADMIN_BOTH\"\n",
        "admin.token_env",
        14,
        "one of token and token_env",
    );
    one(
        "[admin]\ntoken_env = \"\"\n",
        "admin.token_env",
        13,
        "not an environment variable name",
    );
}

#[test]
fn admin_token_env_must_be_set_and_usable() {
    // Names no other test uses: tests run on parallel threads of one process.
    let unset = "KEYMASTER_TEST_ADMIN_TOKEN_NEVER_SET";
    std::env::remove_var(unset);
    one(
        &format!("[admin]\ntoken_env = \"{unset}\"\n"),
        "admin.token_env",
        13,
        "KEYMASTER_TEST_ADMIN_TOKEN_NEVER_SET is not set",
    );
    let e = &errors(&format!("{BASE}[admin]\ntoken_env = \"{unset}\"\n"))[0];
    assert!(
        e.to_string().starts_with("t.toml:13:1: admin.token_env: "),
        "file:line:key first: {e}"
    );

    std::env::set_var("KEYMASTER_TEST_ADMIN_TOKEN_EMPTY", "");
    one(
        "[admin]\ntoken_env = \"KEYMASTER_TEST_ADMIN_TOKEN_EMPTY\"\n",
        "admin.token_env",
        13,
        "is empty",
    );
    std::env::set_var("KEYMASTER_TEST_ADMIN_TOKEN_SHORT", "tiny-secret");
    one(
        "[admin]\ntoken_env = \"KEYMASTER_TEST_ADMIN_TOKEN_SHORT\"\n",
        "admin.token_env",
        13,
        "the value of KEYMASTER_TEST_ADMIN_TOKEN_SHORT is too short",
    );
    let e = &errors(&format!(
        "{BASE}[admin]\ntoken_env = \"KEYMASTER_TEST_ADMIN_TOKEN_SHORT\"\n"
    ))[0];
    assert!(!e.message.contains("tiny-secret"), "the value leaked: {e}");
}

#[test]
fn trace_sample_is_a_ratio() {
    one(
        "trace_sample = 1.5\n",
        "routes[0].trace_sample",
        12,
        "from 0.0 to 1.0",
    );
    let listener = BASE.replacen(
        "address = \"127.0.0.1:8080\"\n",
        "address = \"127.0.0.1:8080\"\ntrace_sample = -0.1\n",
        1,
    );
    let errs = errors(&listener);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].key, "listeners[0].trace_sample");
    assert_eq!(errs[0].line, Some(4));
}

#[test]
fn traces_settings_are_checked() {
    let t = "\n[traces]\nendpoint = \"localhost:4317\"\n";
    one(t, "traces.endpoint", 14, "expected a URL");
    one(
        "\n[traces]\nendpoint = \"http://c:4317\"\nqueue_size = 0\n",
        "traces.queue_size",
        15,
        "from 1 to",
    );
    one(
        "\n[traces]\nendpoint = \"http://c:4317\"\nprotocol = \"http/json\"\n",
        "traces.protocol",
        15,
        "grpc",
    );
    one(
        "\n[traces]\nendpoint = \"http://c:4317\"\nheaders = { \"bad name\" = \"x\" }\n",
        "traces.headers.\"bad name\"",
        15,
        "field name",
    );
}

#[test]
fn mirror_names_a_cluster_and_a_ratio() {
    one(
        "mirror = { cluster = \"nope\" }\n",
        "routes[0].mirror.cluster",
        12,
        "unknown cluster \"nope\"",
    );
    one(
        "mirror = { cluster = \"c\", sample = 2.0 }\n",
        "routes[0].mirror.sample",
        12,
        "from 0.0 to 1.0",
    );
    one(
        "mirror = { cluster = \"c\", max_in_flight = 0 }\n",
        "routes[0].mirror.max_in_flight",
        12,
        "at least 1",
    );
}
