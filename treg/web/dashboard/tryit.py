"""Try it (``/ui/try``): send a request through ``/call/`` or ``/catalog/call/`` as the logged-in user and
see the whole answer — status, headers (a redirect's rewritten ``Location`` among them), body, and the
call's permalink.

The form posts to treg itself, which runs the call through the one pipeline
(:func:`treg.call.service.execute`, surface ``call`` or ``catalog``, exactly what those routes run:
ACL, deny rules, money, audit) with the session as the caller's credential (the cookie and its CSRF
token, checked as on a cookie call), and renders the answer on the page. A browser's ``fetch`` could
not show a redirect: with ``redirect: "manual"`` it gets an opaque answer (status 0, no headers), and
following it would make a second call. Rendered by treg, nothing of the answer is hidden, the page
works without JavaScript, and the upstream's answer never runs as the dashboard's script (it is text
in a page whose policy allows only treg's own script). The body shown is the first
:data:`SHOWN_MAX_BYTES`.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from aiohttp import web

from treg import tools
from treg.call import service
from treg.call.types import CallInput
from treg.errors import BadRequest, TregError
from treg.ids import new_call_id
from treg.mcp.backend import read_answer
from treg.ui_sessions import COOKIE, SessionCookie
from treg.web.dashboard.base import Page, page
from treg.web.jsonio import dumps

routes = web.RouteTableDef()

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: the most of an answer's body the page shows (the rest is read by nobody: the upstream is closed)
SHOWN_MAX_BYTES = 256 * 1024
# what a browser's URL parser leaves as is in a path and in a query (the rest it percent-encodes, as
# the request it would have sent to /call/ carries it): existing %XX escapes are kept
_PATH_SAFE = "!$%&'()*+,-./:;=@[]^_|~"
_QUERY_SAFE = _PATH_SAFE + "?`{}"


def _target(form: dict[str, str]) -> tuple[str, str, str]:
    """(surface, rest, raw query) of the call the form describes, spelled as the browser would send
    ``/call/<tool><path>`` or ``/catalog/call/<endpoint>?<params>``."""
    text = form.get("path", "").strip().partition("#")[0]
    path, _, query = text.partition("?")
    query = urllib.parse.quote(query, safe=_QUERY_SAFE)
    if form.get("surface") == "catalog":
        endpoint = form.get("endpoint", "").strip()
        if not endpoint:
            raise BadRequest("choose a catalog endpoint", code="invalid_form")
        return "catalog", urllib.parse.quote(endpoint, safe=""), query
    tool = form.get("tool", "").strip()
    if not tool:
        raise BadRequest("choose a tool (create one on the Tools page first)", code="invalid_form")
    if not path.startswith("/"):
        path = "/" + path
    return "call", urllib.parse.quote(tool, safe="") + urllib.parse.quote(path, safe=_PATH_SAFE), query


def call_input(p: Page) -> CallInput:
    """The Try it form as the call ``/call/`` (or ``/catalog/call/``) would have received from the browser,
    the session (cookie and CSRF token, already checked by the page) as its credential."""
    form = p.form
    method = form.get("method", "GET").strip().upper()
    if method not in METHODS:
        raise BadRequest(f"the method must be one of {', '.join(METHODS)}", code="invalid_form")
    surface, rest, query = _target(form)
    headers: list[tuple[str, str]] = []
    if ua := p.request.headers.get("User-Agent"):
        headers.append(("User-Agent", ua))
    body: bytes | None = None
    if method != "GET" and form.get("body"):
        # a form sends a textarea's line ends as CRLF; what was typed (and what a script's fetch sent) is LF
        body = form["body"].replace("\r\n", "\n").encode("utf-8")
        headers.append(("Content-Type", form.get("ctype", "").strip() or "application/octet-stream"))
        headers.append(("Content-Length", str(len(body))))
    credential = SessionCookie(p.request.cookies.get(COOKIE, ""), p.session.csrf)
    return CallInput(new_call_id(), surface, method, rest, query, tuple(headers), credential,  # type: ignore[arg-type]
                     None, body, len(body) if body is not None else None, user_agent=ua or None)


def _shown_body(data: bytes, truncated: bool, size: int | None) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        return f"({size if size is not None else len(data)} bytes of binary data, not shown)"
    if truncated:
        text += f"\n… (the first {len(data)} bytes of {size if size is not None else 'more'})"
    return text


async def run(p: Page, inp: CallInput) -> dict[str, Any]:
    """The call, run through the pipeline; what the page shows of its answer (or of treg's refusal)."""
    shown: dict[str, Any] = {"call_id": inp.call_id, "method": inp.method,
                             "target": ("/catalog/call/" if inp.surface == "catalog" else "/call/") + inp.rest
                             + ("?" + inp.raw_query if inp.raw_query else "")}
    try:
        outcome = await service.execute(p.svc, inp)
    except TregError as exc:
        headers = [("Content-Type", "application/json"), ("X-Treg-Error", "1"), *exc.headers.items(),
                   ("X-Treg-Call-Id", inp.call_id)]
        # a 401 is not recorded (no org to record it under): no permalink then
        return {**shown, "status": exc.status, "reason": "", "refused": True, "headers": headers,
                "body": dumps(exc.body()), "location": None, "recorded": exc.status != 401}
    answer, broken = await read_answer(outcome, SHOWN_MAX_BYTES)
    if broken is not None:  # the upstream broke mid-answer: the headers came, the body did not
        return {**shown, "status": outcome.status, "reason": outcome.reason, "refused": True,
                "headers": [*outcome.headers, ("X-Treg-Call-Id", inp.call_id)],
                "body": f"(the answer broke off: {broken.detail})", "location": None, "recorded": True}
    assert answer is not None
    headers = list(answer.headers)
    if outcome.content_length is not None and not any(k.lower() == "content-length" for k, _ in headers):
        headers.append(("Content-Length", str(outcome.content_length)))
    headers.append(("X-Treg-Call-Id", inp.call_id))
    location = next((v for k, v in headers if k.lower() == "location"), None)
    return {**shown, "status": answer.status, "reason": answer.reason, "refused": False,
            "headers": headers, "body": _shown_body(answer.data, answer.truncated, answer.size),
            "location": location, "recorded": True}


async def _try_page(p: Page, *, status: int = 200, answer: dict[str, Any] | None = None,
                    error: str | None = None) -> web.StreamResponse:
    rows = await tools.list_tools(p.svc, p.ident)
    endpoints = [ep.id for ep in p.svc.catalog.search(provider=None, capability=None, q=None, status="live")]
    form = {"surface": "call", "tool": "", "endpoint": "", "method": "GET", "path": "", "body": "",
            "ctype": "application/json", **p.form}
    return p.render("try.html", "try", status=status, tools=rows, endpoints=endpoints, answer=answer, form=form,
                    methods=METHODS, error=error)


@routes.get("/ui/try")
@page
async def try_it(p: Page) -> web.StreamResponse:
    return await _try_page(p)


@routes.post("/ui/try")
@page
async def try_send(p: Page) -> web.StreamResponse:
    try:
        inp = call_input(p)
    except TregError as exc:
        return await _try_page(p, status=exc.status, error=exc.detail)
    return await _try_page(p, answer=await run(p, inp))
