"""Spooled evidence keeps each requested path's leaf at its place, not the whole top-level value: a
plugin asking for ``candidates.0.finishReason`` must not keep the inline image in ``candidates.0.content``."""

import json

import pytest

from treg import hookimpl
from treg.call import metered
from treg.testing import http_response, media_provider, raw_upstream, vendor_gateway

TOKENS = 777


class Classifier:
    @hookimpl
    def treg_spool_evidence_paths(self, endpoint):
        return ["candidates.0.finishReason", "candidates[1].finishReason", "modelVersion", "absent.path"]


def answer(mb):
    image = "A" * (mb * 1024 * 1024)
    return json.dumps({
        "candidates": [{"content": {"parts": [{"inlineData": {"data": image}}]}, "finishReason": "STOP"},
                       {"content": {"parts": [{"inlineData": {"data": image}}]}, "finishReason": "MAX_TOKENS"}],
        "usageMetadata": {"totalTokenCount": TOKENS, "promptTokensDetails": [{"modality": "IMAGE",
                                                                              "blob": image}]},
        "modelVersion": "g-2"}).encode()


async def test_spooled_answer_keeps_only_the_leaves_at_their_paths(aiohttp_client, make_app, monkeypatch):
    payload = answer(mb=5)
    kept = []
    real = metered.spool_evidence

    async def spy(spooled, paths, *args):
        out = await real(spooled, paths, *args)
        kept.append(out)
        return out

    monkeypatch.setattr(metered, "spool_evidence", spy)
    async with raw_upstream(lambda ex: http_response(200, payload, [("Content-Type", "application/json")])) as up, \
            vendor_gateway(aiohttp_client, make_app, [media_provider(up.url)], plugins=(Classifier(),), slug="g",
                           platform={"TREG_PLATFORM_KEY_GEM": "gem-key"}) as gw:
        r = await gw.call("POST", "/catalog/call/gem.generate", json={})
        assert r.status == 200 and await r.read() == payload  # the caller still gets every byte
        assert r.headers["X-Treg-Cost-Micro"] == str(TOKENS * 2)
    # a skeleton of the answer: each leaf at its place, none of the megabytes beside them
    assert kept == [{"candidates": [{"finishReason": "STOP"}, {"finishReason": "MAX_TOKENS"}],
                     "usageMetadata": {"totalTokenCount": TOKENS}, "modelVersion": "g-2"}]
    assert len(json.dumps(kept[0])) < 300


@pytest.mark.parametrize("doc,paths,expected", [
    ({"a": [1, 2, {"b": 3, "c": "x" * 100}]}, ["a.2.b"], {"a": [None, None, {"b": 3}]}),
    ({"a": {"b": {"c": 1, "d": 2}}}, ["a.b"], {"a": {"b": {"c": 1, "d": 2}}}),  # a path to an object keeps it
    ({"a": {"b": 1}}, ["a.b.c", "a.x", "z"], {}),  # nothing there: nothing kept
    ([1, 2], ["0"], {}),  # not an object: empty evidence
])
def test_keep_paths_builds_a_skeleton(doc, paths, expected):
    assert metered._keep_paths(doc, paths) == expected
