"""Stored evidence masks an injected secret in every form an upstream may echo it: raw, percent-encoded
(either case, ``/`` kept or not, ``+`` for space, double-encoded), base64 (standard or URL-safe, padded
or not), hex (either case) and JSON string escapes (over real HTTP: a failing upstream echoes them)."""

import asyncio
import base64
import json
import re
from urllib.parse import quote, quote_plus

import pytest

from treg.redaction import Redactor
from treg.testing import http_response

# characters that every encoder treats differently: / + space = & quotes, backslash, non-ASCII
SECRET = 'sk/Live+ab cd=ef&gh"ij\'kl\\mn\u00e9\u00df\U0001F511op'


def _lower(s: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), s)


def forms(secret: str) -> dict[str, str]:
    raw = secret.encode()
    b64, b64u = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    escaped = json.dumps(secret)[1:-1]
    return {
        "raw": secret,
        "percent": quote(secret, safe=""), "percent_slash_kept": quote(secret, safe="/"),
        "percent_lower": _lower(quote(secret, safe="")), "percent_slash_kept_lower": _lower(quote(secret, safe="/")),
        "plus": quote_plus(secret), "plus_slash_kept": quote_plus(secret, safe="/"),
        "double": quote(quote(secret, safe=""), safe=""), "double_lower": quote(_lower(quote(secret, safe="")), safe=""),
        "double_plus": quote_plus(quote_plus(secret)),
        "base64": b64, "base64_unpadded": b64.rstrip("="), "base64_url": b64u, "base64_url_unpadded": b64u.rstrip("="),
        "hex": raw.hex(), "hex_upper": raw.hex().upper(),
        "json_ascii": escaped, "json_unicode": json.dumps(secret, ensure_ascii=False)[1:-1],
        "json_slash": escaped.replace("/", "\\/"),
        "json_upper_u": re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), escaped),
        "json_all_u": "".join("\\u%04x" % u for u in
                              (int.from_bytes(secret.encode("utf-16-be")[i:i + 2], "big")
                               for i in range(0, len(secret.encode("utf-16-be")), 2))),
    }


def _ascii_header(text: str) -> bool:
    return all(32 <= ord(c) < 127 for c in text)


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_every_listed_form_is_masked_in_text_and_bytes():
    r = Redactor.for_values([SECRET])
    for name, form in forms(SECRET).items():
        assert r.text(f"<{form}>") == "<[REDACTED]>", name
        assert r.data(f"<{form}>".encode()) == b"<[REDACTED]>", name


@pytest.mark.parametrize("status", [401, 503])
async def test_echoed_secret_is_in_no_form_in_stored_evidence(gateway, up, status):
    sid = await gateway.secret(SECRET, name="k")
    await gateway.tool("echo", up.url + "/v1", [{"location": "query", "name": "x", "secret_id": sid}])
    all_forms = forms(SECRET)
    body = json.dumps({"error": "bad key", "echo": all_forms}, ensure_ascii=False)
    body += "\n" + "\n".join(all_forms.values())  # and each form bare, outside any JSON string
    headers = [("Content-Type", "application/json; charset=utf-8")]
    headers += [(f"X-Echo-{name.replace('_', '-')}", form) for name, form in all_forms.items() if _ascii_header(form)]
    up.responder = lambda ex: (b"HTTP/1.1 %d Nope\r\n" % status
                               + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
                               + b"Content-Length: %d\r\n\r\n" % len(body.encode()) + body.encode())
    r = await gateway.call("GET", "/call/echo/things?q=1")
    assert r.status == status and (await r.read()).decode() == body  # the caller still gets the upstream's answer
    assert up.last.target == f"/v1/things?q=1&x={quote(SECRET, safe='')}"
    call_id = r.headers["X-Treg-Call-Id"]
    for _ in range(200):  # the audit writer batches: bounded wait for the row
        detail = await gateway.api("GET", f"/api/v1/calls/{call_id}")
        if isinstance(detail, dict) and detail.get("error_response"):
            break
        await asyncio.sleep(0.02)
    stored = {"error_request": detail["error_request"], "error_response": detail["error_response"]}
    assert stored["error_response"]["status"] == status
    text = "\n".join(_strings(stored))
    assert "[REDACTED]" in stored["error_response"]["body"]
    assert any(k.startswith("X-Echo-") for k, _ in stored["error_response"]["headers"])
    for name, form in all_forms.items():
        assert form not in text, f"the {name} form of the secret is in the stored evidence"
    raw = json.dumps(detail)
    for name, form in all_forms.items():
        assert form not in raw, name


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_secret_echoed_inside_a_compressed_failed_answer_is_masked(gateway, up, coding):
    import gzip
    import zlib

    sid = await gateway.secret(SECRET, name="k")
    await gateway.tool("echo", up.url + "/v1", [{"location": "query", "name": "x", "secret_id": sid}])
    plain = json.dumps({"error": "bad key", "echo": forms(SECRET)}, ensure_ascii=False).encode()
    packed = gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
    up.responder = lambda ex: http_response(403, packed, [("Content-Type", "application/json"),
                                                          ("Content-Encoding", coding)], reason="Forbidden")
    r = await gateway.raw("GET", "/call/echo/x", [("Accept-Encoding", coding)])
    assert r.status == 403 and r.body == packed  # relayed as sent
    for _ in range(200):
        detail = await gateway.api("GET", f"/api/v1/calls/{r.header('X-Treg-Call-Id')}")
        if isinstance(detail, dict) and detail.get("error_response"):
            break
        await asyncio.sleep(0.02)
    body = detail["error_response"]["body"]
    assert isinstance(body, str) and body.startswith('{"error": "bad key"') and "[REDACTED]" in body
    assert detail["error_response"]["body_truncated"] is False
    for name, form in forms(SECRET).items():
        assert form not in body, name


async def test_platform_key_echoed_in_its_forms_is_masked_and_its_redactor_memoized(aiohttp_client, make_app):
    from treg import membership
    from treg.keys import SERVICES
    from treg.settings import SecretStr
    from treg.testing import Gateway, ProviderPlugin, example_provider, raw_upstream

    key = "pk/plat+form key=é"
    echo = "\n".join(forms(key).values()).encode()
    async with raw_upstream(lambda ex: http_response(401, echo, [("Content-Type", "text/plain; charset=utf-8")])) as up:
        app = make_app(extra_plugins=(ProviderPlugin([example_provider(up.url + "/v1")]),),
                       ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_ACME": SecretStr(key)})
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="p", email="p@p.test")
        gw = Gateway(client, org)
        await money_grant(gw)
        ids = []
        for _ in range(2):
            r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
            assert r.status == 401 and r.headers["X-Treg-Credential-Tier"] == "platform"
            ids.append(r.headers["X-Treg-Call-Id"])
        memo = gw.services.platform_redactors
        for call_id in ids:
            for _ in range(200):
                detail = await gw.api("GET", f"/api/v1/calls/{call_id}")
                if isinstance(detail, dict) and detail.get("error_response"):
                    break
                await asyncio.sleep(0.02)
            text = json.dumps(detail, ensure_ascii=False)
            for name, form in forms(key).items():
                assert form not in "\n".join(_strings(detail)), name
            assert "[REDACTED]" in text
        assert len(memo._redactors) == 1  # built once for both calls
        await client.close()


async def money_grant(gw):
    from treg import money

    await money.grant(gw.services, org_id=gw.org["org_id"], amount_micro=100_000, actor="t")
