"""Speed trick, named: **the lean request**: one upstream request through the shared session's own parts
(its connector, request and response classes, timeouts and limits) without ``ClientSession._request``.

``ClientSession._request`` serves every option aiohttp offers: redirects, cookie jars, proxies and
``trust_env``, netrc, ``auth``, ``params``, ``json``, traces, client middlewares, a total timeout,
upload trackers. treg's session (:func:`treg.infra.upstream.create_session`) uses none of them on a call,
and that general path was the largest single function of a relayed call (about 500 bytecodes of the
~9 000 a call runs; figures in docs/performance.md, round 13). :func:`lean_request` is the part of it
treg's configuration reaches, in the same order, with the same errors:

* the scheme check (``NonHttpUrlClientError``) and the missing-host check (``InvalidUrlClientError``);
* the request built by the session's ``request_class`` (treg's ``FaithfulRequest``) with the session's
  ``skip_auto_headers``, HTTP version, loop and response class, no cookies, no auth, no proxy;
* the connection from the session's connector (``ConnectionTimeoutError`` on its timeout), the
  response parameters the session would set (read timeout, buffer size, header limits, no
  decompression), send, then the head read, each closing what it opened when it fails;
* one retry of an idempotent method on a kept-alive connection the upstream had closed
  (``ServerDisconnectedError`` / ``ClientOSError``, RFC 9112 9.3.1), re-using the request's payload as
  aiohttp does, never when that payload was already consumed;
* a bare ``OSError`` raised as ``ClientOSError``; the request's payload closed once the head is in.

:func:`usable` says when it applies: an ``aiohttp.ClientSession`` with no trace configs, no client
middlewares, no cookie jar but the dummy one, no redirects to follow, and a URL without ``user:pw@``
(aiohttp's own path turns those into Basic auth and refuses it beside an Authorization header); anything
else goes through ``session.request``. aiohttp is pinned to the minor release this was read against, and
``tests/test_aiohttp_canary.py`` fails when one of the internals named here moves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import client_exceptions as errors
from aiohttp.client import IDEMPOTENT_METHODS  # retried once on a kept-alive connection the upstream closed
from aiohttp.client_reqrep import ClientResponse
from aiohttp.helpers import EMPTY_BODY_METHODS, TimerNoop  # EMPTY_BODY_METHODS: an answer with no body to read
from yarl import URL

#: the session's total timeout is None (treg keeps its own read deadlines), so its timer is a no-op
_NO_TIMER = TimerNoop()


def usable(session: Any, url: URL) -> bool:
    """The lean request can stand in for ``session.request`` here (see the module's docstring)."""
    return (type(session) is aiohttp.ClientSession and not session._trace_configs and not session._middlewares
            and type(session._cookie_jar) is aiohttp.DummyCookieJar and session._timeout.total is None
            and url.raw_user is None and url.raw_password is None)


async def lean_request(session: aiohttp.ClientSession, method: str, url: URL, data: Any) -> ClientResponse:
    """``session.request(method, url, data=data, allow_redirects=False)`` for a session :func:`usable`
    says fits: the response once its head arrived; the body streams."""
    if session.closed:
        raise RuntimeError("Session is closed")
    connector = session._connector
    assert connector is not None
    if url.scheme not in connector.allowed_protocol_schema_set:
        raise errors.NonHttpUrlClientError(url)
    if not url.raw_host:
        raise errors.InvalidUrlClientError(url)
    method = method.upper()
    timeout = session._timeout
    retry = session._retry_connection and method in IDEMPOTENT_METHODS
    req = None
    resp = None
    try:
        while True:
            req = session._request_class(
                method, url, headers=None, skip_auto_headers=session._skip_auto_headers or None, data=data,
                version=session._version, loop=session._loop, response_class=session._response_class,
                timer=_NO_TIMER, session=session, traces=[])
            try:
                try:
                    conn = await connector.connect(req, traces=[], timeout=timeout)
                except asyncio.TimeoutError as exc:
                    raise errors.ConnectionTimeoutError(f"Connection timeout to host {req.url}") from exc
                assert conn.protocol is not None
                conn.protocol.set_response_params(
                    timer=_NO_TIMER, skip_payload=method in EMPTY_BODY_METHODS, read_until_eof=True,
                    auto_decompress=session._auto_decompress, read_timeout=timeout.sock_read,
                    read_bufsize=session._read_bufsize, timeout_ceil_threshold=connector._timeout_ceil_threshold,
                    max_line_size=session._max_line_size, max_field_size=session._max_field_size,
                    max_headers=session._max_headers)
                try:
                    resp = await req.send(conn)
                    try:
                        await resp.start(conn)
                    except BaseException:
                        resp.close()
                        raise
                except BaseException:
                    conn.close()
                    raise
            except (errors.ConnectionTimeoutError, errors.ClientConnectorError):
                raise  # connection errors are never retried (the certificate and SSL ones are subclasses)
            except (errors.ClientOSError, errors.ServerDisconnectedError):
                if not retry:
                    raise
                retry = False
                resp = None
                if data is not None:
                    # the payload rewinds itself once the cancelled writer settled; a consumed one cannot
                    await req.close()
                    if req._body is not None and req._body.consumed:
                        raise
                    data = req._body
                continue
            except errors.ClientError:
                raise
            except OSError as exc:
                if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                    raise
                raise errors.ClientOSError(*exc.args) from exc
            break
        if req._body is not None:
            await req._body.close()
        return resp
    except BaseException:
        if resp is not None:
            resp.close()
        if req is not None and req._body is not None:
            await req._body.close()
        raise
