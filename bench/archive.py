"""The archive case: a catalog endpoint whose vendor takes ``--archive-vendor-ms`` to answer, called
through treg once per distinct query with ``X-Treg-Cache: bypass`` (every call reaches the vendor), then
repeatedly for one stored query (every call an archive hit, answered from treg's database).

The provider is a plugin file in treg's ``TREG_PLUGINS_DIR`` (as an operator would install one); the
org calls it on the team tier (its own key, so no credit is needed). The upstream counts its lookups:
the report shows the vendor saw none of the hits. Calls are sequential (concurrency 1), bounded by
``--archive-calls`` and a time cap, all on 127.0.0.1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PROVIDER = "benchcache"
ENDPOINT = "benchcache.find"

PLUGIN = '''
from treg import hookimpl


@hookimpl
def treg_register_providers():
    return [{{"id": "{provider}", "base_url": "{url}",
             "auth": [{{"location": "header", "name": "Authorization", "format": "Bearer {{secret}}"}}],
             "endpoints": [{{"id": "{endpoint}", "method": "GET", "path": "/lookup",
                            "params": [{{"name": "q", "in": "query"}}, {{"name": "delay_ms", "in": "query"}}],
                            "price": {{"per_call_micro": 1000}}, "archive": {{"ttl_s": 3600}}}}]}}]


@hookimpl
def treg_register_result_classifiers():
    return [{{"endpoint": "{endpoint}", "hit": {{"path": "data.emails", "nonempty": True}}}}]
'''


def write_plugin(folder: Path, upstream_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchcache.py").write_text(PLUGIN.format(provider=PROVIDER, endpoint=ENDPOINT, url=upstream_url))
    return folder


def _pct(sorted_s: list[float], p: float) -> float:
    if not sorted_s:
        return 0.0
    return sorted_s[min(len(sorted_s) - 1, int(round(p / 100 * (len(sorted_s) - 1))))]


async def archive_case(port: int, token: str, upstream_url: str, *, calls: int, vendor_ms: float,
                       time_cap: float) -> dict[str, Any]:
    import aiohttp

    base = f"http://127.0.0.1:{port}"
    h = {"X-Treg-Token": token}
    out: dict[str, Any] = {"calls_per_kind": calls, "vendor_delay_ms": vendor_ms, "errors": 0, "sent": 0}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.post(f"{base}/api/v1/secrets", headers=h,
                          json={"name": "bench-cache-key", "value": "sk_cache_bench", "provider": PROVIDER}) as r:
            if r.status != 201:
                raise RuntimeError(f"creating the team key failed: {r.status} {await r.text()}")

        async def lookups() -> int:
            async with s.get(f"{upstream_url}/lookup-count") as r:
                return int((await r.json())["lookups"])

        async def one(q: str, cache: str | None) -> tuple[float, str | None]:
            headers = dict(h, **({"X-Treg-Cache": cache} if cache else {}))
            t0 = time.perf_counter()
            async with s.get(f"{base}/catalog/call/{ENDPOINT}?q={q}&delay_ms={vendor_ms:g}", headers=headers) as r:
                await r.read()
                took = time.perf_counter() - t0
                out["sent"] += 1
                if r.status != 200:
                    out["errors"] += 1
                return took, r.headers.get("X-Treg-Cache")

        deadline = time.monotonic() + time_cap
        vendor: list[float] = []
        for i in range(calls):
            if time.monotonic() > deadline:
                break
            took, _ = await one(f"v{i}", "bypass")
            vendor.append(took)
        _, primed = await one("stored", None)
        before = await lookups()
        hits: list[float] = []
        states: dict[str, int] = {}
        for _ in range(calls):
            if time.monotonic() > deadline:
                break
            took, state = await one("stored", None)
            hits.append(took)
            states[str(state)] = states.get(str(state), 0) + 1
        vendor_lookups_during_hits = await lookups() - before
    vendor.sort()
    hits.sort()
    out.update({
        "priming_call": primed, "hit_states": states, "vendor_lookups_during_hits": vendor_lookups_during_hits,
        "vendor_calls": len(vendor), "hit_calls": len(hits),
        "vendor_p50_ms": round(_pct(vendor, 50) * 1000, 3), "vendor_p99_ms": round(_pct(vendor, 99) * 1000, 3),
        "hit_p50_ms": round(_pct(hits, 50) * 1000, 3), "hit_p99_ms": round(_pct(hits, 99) * 1000, 3),
    })
    out["hit_p50_over_vendor_p50"] = round(out["hit_p50_ms"] / out["vendor_p50_ms"], 3) if out["vendor_p50_ms"] else None
    out["ok"] = (out["errors"] == 0 and primed == "stored" and states == {"hit": len(hits)}
                 and vendor_lookups_during_hits == 0 and len(hits) > 0)
    return out
