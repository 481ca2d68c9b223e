"""Deny rules match what the upstream will understand (api.md "Details that are fixed"): no spelling of
a denied path, method or host gets past a rule that its plain spelling would hit, while paths that
merely look alike are not caught."""

import pytest

from treg.domain.deny import DenyRule, effective_methods, first_match, host_matches, path_forms, path_matches

RULE = "/status/418"

# every one of these reaches /status/418 on an ordinary upstream (one that decodes %2F or \ included)
DODGES = [
    "/status/418", "//status/418", "/status//418", "///status///418", "/status/418/", "/STATUS/418",
    "/Status/418", "/status/418;x=1", "/status;a=b/418", "/;x/status/418", "/./status/418",
    "/status/./418", "/v1/../status/418", "/a/b/../../status/418", "/../status/418", "/v1/%2e%2e/status/418",
    "/v1/%2E%2E/status/418", "/v1/.%2e/status/418", "/%2e/status/418", "/%73tatus/418", "/%53TATUS/%34%31%38",
    "/status%2F418", "/status%2f418", "/v1%2F..%2Fstatus/418", "/status%5C418", "/status/418%3Bx=1",
    "/v1/..;x=1/status/418", "/status/418/anything", "/status/418;/x", "/v1//../status/418",
    # lenient decoders: decoded twice, overlong UTF-8 for ASCII, trailing dots cut from a segment (IIS)
    "/v1/%252e%252e/status/418", "/v1/%252E%252E/status/418", "/status%252F418", "/v1/%c0%ae%c0%ae/status/418",
    "/v1/%C0%AE./status/418", "/status%c0%af418", "/status/418.", "/status./418", "/status.../418",
    # ... written or encoded, dots and spaces alike (issue 20 item 11: ``%2e`` once passed where ``.`` did not)
    "/status/418%2e", "/status/418%2E", "/status/418%2e%2e", "/status/418%2E%2e", "/status/418%2e/sub",
    "/status%2e/418", "/status/418%20", "/status/418.%20", "/status/418%2e%20", "/status/418%20%2e",
    "/status/418%252e", "/status/418%2520", "/status/418%c0%ae", "/status/418%c0%a0", "/STATUS/418%2E",
    "/status%20/418/x", "/v1/..%20/status/418", "/status/418 ", "/status/418. ", "/status /418",
]

# ... and these are other resources
LOOKALIKES = ["/status/4180", "/status/418x", "/status/418X", "/status/41", "/statuses/418", "/status",
              "/status/", "/xstatus/418", "/v1/status/418", "/status/%2e418", "/status/%20418",
              "/status/418.json", "/status/..418", "/status/418%2500", "/status/418%09", "/status/418_"]


@pytest.mark.parametrize("path", DODGES)
def test_every_spelling_of_the_denied_path_matches(path):
    assert path_matches(RULE, path), path_forms(path)


@pytest.mark.parametrize("path", LOOKALIKES)
def test_lookalike_paths_are_not_denied(path):
    assert not path_matches(RULE, path), path_forms(path)


@pytest.mark.parametrize("rule_path", ["/status/418", "/STATUS/418", "/status//418/", "/status/418;v=2",
                                       "/x/../status/418", "/%73tatus/418", "/status/./418"])
def test_the_rule_path_is_canonicalised_the_same_way(rule_path):
    assert path_matches(rule_path, "/status/418")
    assert path_matches(rule_path, "/Status//418;p")
    assert not path_matches(rule_path, "/status/4180")


def test_an_encoded_slash_in_the_rule_matches_either_reading():
    # an upstream may or may not decode %2F: the rule holds for both readings
    assert path_matches("/repos/a%2Fb", "/repos/a%2fb")
    assert path_matches("/repos/a%2Fb", "/repos/a/b")
    assert path_matches("/repos/a/b", "/repos/a%2Fb/issues")
    assert not path_matches("/repos/a%2Fb", "/repos/a%2Fbc")


def test_segment_boundary_and_root_rules():
    assert path_matches("/v1/charges", "/v1/charges/ch_1")
    assert not path_matches("/v1/charges", "/v1/chargesX")
    assert not path_matches("/v1/charges", "/v1/charges%58")  # %58 is X
    assert path_matches("/", "/anything") and path_matches(None, "/x") and path_matches("/", "/")


def test_host_case_trailing_dot_and_ports():
    assert host_matches("API.example.com.", "api.example.com", "https")
    assert host_matches("api.example.com", "API.EXAMPLE.COM.:8443", "https")
    assert host_matches("api.example.com:443", "api.example.com.", "https")
    assert host_matches("api.example.com:443", "api.example.com:0443", "https")
    assert host_matches("api.example.com:80", "user@API.example.com", "http")
    assert not host_matches("api.example.com:443", "api.example.com", "http")
    assert not host_matches("api.example.com:8443", "api.example.com.", "https")
    assert not host_matches("example.com", "api.example.com", "https")
    assert host_matches("[::1]:8080", "[::1]:8080", "http") and not host_matches("[::1]:8080", "[::1]", "http")


def test_method_overrides_count_as_the_method():
    assert effective_methods("POST", [("X-HTTP-Method-Override", "get")]) == {"POST", "GET"}
    assert effective_methods("post", [("x-http-method", " Delete ")]) == {"POST", "DELETE"}
    assert effective_methods("POST", [("X-METHOD-OVERRIDE", "PUT, PATCH")]) == {"POST", "PUT", "PATCH"}
    assert effective_methods("HEAD") == {"HEAD", "GET"}
    assert effective_methods("POST", [("X-Other", "GET")]) == {"POST"}


def test_the_method_override_query_parameter_counts_as_the_method():
    # Rails, Laravel and Symfony read ``_method`` as the method of a POST
    assert effective_methods("POST", (), [("_method", "DELETE")]) == {"POST", "DELETE"}
    assert effective_methods("POST", (), [("%5Fmethod", "put"), ("x", None)]) == {"POST", "PUT"}
    assert effective_methods("POST", (), [("_method", None), ("method", "DELETE")]) == {"POST"}
    rule = DenyRule(id="r", host="h", path="/x", method="DELETE")
    kw = dict(scheme="https", host="h", path="/x", member_id="m", project_id=None)
    assert first_match([rule], method="POST", query=[("_method", "delete")], **kw) is rule
    assert first_match([rule], method="POST", query=[("other", "delete")], **kw) is None


def test_first_match_uses_every_method_and_spelling():
    rules = [DenyRule(id="r", host="h", path="/Status/418", method="get")]
    kw = dict(scheme="https", host="H.", member_id="m", project_id=None)
    assert first_match(rules, path="/status//418;x", method="post", headers=[("X-HTTP-Method", "GET")], **kw)
    assert first_match(rules, path="/status/418", method="HEAD", **kw)
    assert first_match(rules, path="/status/418", method="POST", **kw) is None
    assert first_match(rules, path="/status/4180", method="GET", **kw) is None


# -- over real HTTP: gateway → treg → the raw recorder -------------------------------------------------

@pytest.fixture
async def denied(gateway, up):
    """The tool ``t`` at the upstream's root, and a rule on ``GET 127.0.0.1/status/418``."""
    await gateway.tool("t", up.url)
    rule = await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                             json={"host": "127.0.0.1", "path": RULE, "method": "GET", "reason": "teapot"})
    return rule


def _shapes(up, path):
    """The same upstream path through the named and the passthrough shape."""
    return [f"/call/t{path}", f"/call/{up.url}{path}"]


async def _assert_denied(gateway, r, rule, *, head=False):
    assert r.status == 403, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1"
    if not head:  # an answer to HEAD has no body
        body = r.json()
        assert body["error"] == "denied_by_rule" and body["blame"] and body["rule"]["id"] == rule["id"]
        assert rule["id"] in body["detail"] and "teapot" in body["detail"]
    row = await gateway.api("GET", f"/api/v1/calls/{r.header('X-Treg-Call-Id')}", expect=200)
    assert row["outcome"] == "refused" and row["refused_by"] == "deny" and row["status"] == 403
    assert row["error_code"] == "denied_by_rule"


# the spellings issue 20 reported (a rule on /victim/admin): each reached the upstream on the old code
VICTIM_DODGES = ["/victim/admin%2e", "/victim/admin%2E", "/victim/admin%2e%2e", "/victim/admin%2e/sub",
                 "/victim/admin%252e", "/victim/admin%c0%ae", "/victim/admin.", "/victim/admin%20",
                 "/victim/admin.%20", "/victim/ADMIN%2E%2e/sub", "/victim%2e/admin%20/x"]


@pytest.mark.parametrize("path", VICTIM_DODGES)
async def test_trailing_dots_and_spaces_of_a_segment_are_denied_however_written(gateway, up, path):
    await gateway.tool("t", up.url)
    rule = await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                             json={"host": "127.0.0.1", "path": "/victim/admin", "reason": "teapot"})
    for target in _shapes(up, path):
        await _assert_denied(gateway, await gateway.raw("GET", target), rule)
    assert up.exchanges == []
    for other in ("/victim/admins", "/victim/.admin", "/victim/admin.json"):  # other resources still pass
        assert (await gateway.raw("GET", f"/call/t{other}")).status == 200
    assert [ex.target for ex in up.exchanges] == ["/victim/admins", "/victim/.admin", "/victim/admin.json"]


HTTP_DODGES = ["//status/418", "/status/418;x=1", "/STATUS/418", "/status/418/", "/status//418",
               "/./status/418", "/v1/../status/418", "/v1/%2e%2e/status/418", "/status%2F418", "/%73tatus/418",
               "/status;v=1/418", "/v1/..;/status/418", "/status%5C418", "/v1/%252e%252e/status/418",
               "/v1/%c0%ae%c0%ae/status/418", "/status/418."]


@pytest.mark.parametrize("path", HTTP_DODGES)
async def test_path_spellings_are_denied_in_both_shapes(gateway, up, denied, path):
    for target in _shapes(up, path):
        await _assert_denied(gateway, await gateway.raw("GET", target), denied)
    assert up.exchanges == []  # the upstream received nothing


@pytest.mark.parametrize("header", ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override",
                                    "x-http-method-override"])
@pytest.mark.parametrize("value", ["GET", "get"])
async def test_method_override_headers_are_denied(gateway, up, denied, header, value):
    for target in _shapes(up, RULE):
        r = await gateway.raw("POST", target, [(header, value)], body=b"")
        await _assert_denied(gateway, r, denied)
    assert up.exchanges == []


async def test_a_method_override_query_parameter_is_denied(gateway, up, denied):
    for target in _shapes(up, RULE + "?_method=GET"):
        await _assert_denied(gateway, await gateway.raw("POST", target), denied)
    assert up.exchanges == []


async def test_head_runs_the_get_handler_so_it_is_denied(gateway, up, denied):
    for target in _shapes(up, RULE):
        await _assert_denied(gateway, await gateway.raw("HEAD", target), denied, head=True)
    assert up.exchanges == []


async def test_lowercase_method_never_reaches_the_upstream(gateway, up, denied):
    for target in _shapes(up, RULE):
        r = await gateway.raw("get", target)
        if r.status == 400:  # aiohttp's parser refuses a lower-case method: not a dodge either
            continue
        await _assert_denied(gateway, r, denied)
    assert up.exchanges == []


async def test_lookalikes_and_other_methods_still_pass(gateway, up, denied):
    for path in ("/status/4180", "/status/418x", "/statuses/418"):
        for target in _shapes(up, path):
            assert (await gateway.raw("GET", target)).status == 200, target
    assert (await gateway.raw("POST", f"/call/t{RULE}", body=b"")).status == 200
    assert [ex.target for ex in up.exchanges] == ["/status/4180", "/status/4180", "/status/418x", "/status/418x",
                                                  "/statuses/418", "/statuses/418", "/status/418"]


@pytest.fixture
async def named_host(gateway, up, fake_dns):
    fake_dns.records["api.test"] = [("127.0.0.1", 60)]
    await gateway.tool("named", f"http://api.test:{up.port}")
    return f"api.test:{up.port}"


@pytest.mark.parametrize("rule_host", ["api.test", "API.TEST.", "api.test.:{port}", "Api.Test:{port}"])
async def test_host_spellings_in_the_rule(gateway, up, named_host, rule_host):
    host = rule_host.format(port=up.port)
    rule = await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                             json={"host": host, "path": RULE, "reason": "teapot"})
    for target in (f"/call/named{RULE}", f"/call/http://API.test:{up.port}{RULE}",
                   f"/call/http://api.test:{up.port}/STATUS//418"):
        await _assert_denied(gateway, await gateway.raw("GET", target), rule)
    assert up.exchanges == []


async def test_a_rule_on_another_port_does_not_fire(gateway, up, named_host):
    await gateway.api("POST", "/api/v1/deny-rules", expect=201, json={"host": "api.test.:1", "path": RULE})
    assert (await gateway.raw("GET", f"/call/named{RULE}")).status == 200
    assert up.last.target == RULE


# a NUL is refused earlier, by the JSON reader, for every management body (invalid_json)
@pytest.mark.parametrize("path, code", [("/status/418?x=1", "invalid_path"), ("/status#frag", "invalid_path"),
                                        ("/status/\x00", "invalid_json")])
async def test_a_rule_path_that_could_never_fire_is_refused(gateway, path, code):
    r = await gateway.client.post("/api/v1/deny-rules", json={"host": "127.0.0.1", "path": path},
                                  headers=gateway.owner)
    body = await r.json()
    assert r.status == 400 and body["error"] == code and r.headers["X-Treg-Error"] == "1"
