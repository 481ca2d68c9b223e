"""The snippets of docs/clients.md, run as written against a fake vendor on 127.0.0.1: each SDK sends
``X-Treg-Token`` to treg, treg injects the tool's real key over the SDK's placeholder, and the vendor
never sees the treg token."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

import anthropic
import openai
import pytest
import requests
import stripe

from treg.testing import Exchange, http_response, raw_upstream

KEY = "sk_real_vendor_key_42"


def _json(data: object) -> bytes:
    return http_response(200, json.dumps(data).encode(), [("Content-Type", "application/json")])


async def _vendor_answer(ex: Exchange) -> bytes:
    if ex.target.startswith("/v1/chat/completions"):
        return _json({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "pong"}}]})
    if ex.target.startswith("/v1/messages"):
        return _json({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                      "stop_reason": "end_turn", "stop_sequence": None,
                      "content": [{"type": "text", "text": "pong"}], "usage": {"input_tokens": 1, "output_tokens": 1}})
    if ex.target.startswith("/v1/customers"):
        email = parse_qs(ex.body.decode())["email"][0]
        return _json({"id": "cus_1", "object": "customer", "email": email})
    return http_response(404, b"{}")


@pytest.fixture
async def vendor(gateway):
    async with raw_upstream(_vendor_answer) as up:
        sid = await gateway.secret(KEY)
        bearer = [{"location": "header", "name": "Authorization", "format": "Bearer {secret}", "secret_id": sid}]
        for name in ("openai", "anthropic", "stripe"):  # the docs' tools, on the fake vendor's root
            await gateway.tool(name, up.url, bearer)
        yield up


def _treg(gateway) -> str:
    return f"http://127.0.0.1:{gateway.client.port}"


def _check(vendor, gateway) -> Exchange:
    ex = vendor.last
    assert ex.header("authorization") == f"Bearer {KEY}"  # the tool's key, over the SDK's placeholder
    assert not [k for k, _ in ex.headers if k.lower().startswith("x-treg")]
    assert gateway.org["token"].encode() not in ex.raw
    return ex


async def test_openai_sdk_with_default_headers(gateway, vendor):
    TREG, TREG_TOKEN = _treg(gateway), gateway.org["token"]
    client = openai.OpenAI(api_key="set-by-treg", base_url=f"{TREG}/call/openai/v1",
                           default_headers={"X-Treg-Token": TREG_TOKEN})
    out = await asyncio.to_thread(client.chat.completions.create, model="m",
                                  messages=[{"role": "user", "content": "ping"}])
    assert out.choices[0].message.content == "pong"
    assert _check(vendor, gateway).target == "/v1/chat/completions"


async def test_anthropic_sdk_with_default_headers(gateway, vendor):
    TREG, TREG_TOKEN = _treg(gateway), gateway.org["token"]
    client = anthropic.Anthropic(api_key="set-by-treg", base_url=f"{TREG}/call/anthropic",
                                 default_headers={"X-Treg-Token": TREG_TOKEN})
    out = await asyncio.to_thread(client.messages.create, model="m", max_tokens=5,
                                  messages=[{"role": "user", "content": "ping"}])
    assert out.content[0].text == "pong"
    assert _check(vendor, gateway).target == "/v1/messages"


async def test_stripe_sdk_through_a_requests_session(gateway, vendor):
    TREG, TREG_TOKEN = _treg(gateway), gateway.org["token"]
    session = requests.Session()
    session.headers["X-Treg-Token"] = TREG_TOKEN
    client = stripe.StripeClient("sk_set_by_treg", base_addresses={"api": f"{TREG}/call/stripe"},
                                 http_client=stripe.RequestsClient(session=session))
    customer = await asyncio.to_thread(client.v1.customers.create, params={"email": "a@example.com"})
    assert customer.id == "cus_1" and customer.email == "a@example.com"
    ex = _check(vendor, gateway)
    assert ex.method == "POST" and ex.target == "/v1/customers"


async def test_stripe_module_globals_through_a_requests_session(gateway, vendor, monkeypatch):
    TREG, TREG_TOKEN = _treg(gateway), gateway.org["token"]
    session = requests.Session()
    session.headers["X-Treg-Token"] = TREG_TOKEN
    monkeypatch.setattr(stripe, "api_key", "sk_set_by_treg")
    monkeypatch.setattr(stripe, "api_base", f"{TREG}/call/stripe")
    monkeypatch.setattr(stripe, "default_http_client", stripe.RequestsClient(session=session))
    customer = await asyncio.to_thread(stripe.Customer.create, email="b@example.com")
    assert customer.id == "cus_1" and customer.email == "b@example.com"
    assert _check(vendor, gateway).target == "/v1/customers"
