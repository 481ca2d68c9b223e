"""The catalog's features, by stage: treg/call/__init__.py's table against the code, both ways.

Every function the table names is its feature module's; every part ``service.execute`` and the settle
stage's metered answer call is in the table, in the row of its module; and the numbers of the "after 3"
and "6 settle" columns are the order in which those two call them. A part added to a stage without a
row, or moved in a stage without its number, fails here naming it.

And the one behaviour the table's "5 relay" cell promises: only a platform-tier call's send goes through
the capacity stage; every other call (an own tool's, a team key's) is the relay's plain send.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

import treg.call
from treg.call import (archive, capacity_stage, catalog_stage, demo, hub_stage, hub_views, jobs, overflow_stage, record,
                       relay, reserve, resolve, resources, service, settle, table as table_part)
from treg.call.state import CallState

#: a row of the table → where its names live
FEATURES = {"owned resources": (resources,), "async jobs": (jobs,), "capacity": (capacity_stage,),
            "overflow": (overflow_stage,), "archive": (archive,), "money": (reserve, settle, CallState),
            "/table/": (table_part,), "public demo": (demo,), "hub": (hub_stage, hub_views)}
MODULES = {resources: "owned resources", jobs: "async jobs", capacity_stage: "capacity",
           overflow_stage: "overflow", archive: "archive", table_part: "/table/", demo: "public demo",
           hub_stage: "hub", hub_views: "hub"}


def table() -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the column titles, feature → column → the cell's text, its continuation lines joined)."""
    doc = treg.call.__doc__ or ""
    lines = doc.split("\n")
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+)+", line)]
    assert len(rules) == 3, "the table is a simple reST table: a rule, the titles, a rule, rows, a rule"
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[rules[0]])]

    def cells(line: str) -> list[str]:
        return [line[a:b if i + 1 < len(spans) else None].strip() for i, (a, b) in enumerate(spans)]

    titles = cells(lines[rules[0] + 1])
    rows: dict[str, dict[str, str]] = {}
    current = ""
    for line in lines[rules[1] + 1:rules[2]]:
        row = cells(line)
        current = row[0] or current
        for title, cell in zip(titles[1:], row[1:]):
            if cell:
                rows.setdefault(current, {}).setdefault(title, "")
                rows[current][title] += " " + cell
    return titles, rows


#: the parts whose name is one word (every other word of a cell without an underscore is prose)
ONE_WORD = ("guard", "lookup", "send", "observe", "deferred", "intake", "settles", "finish", "screen",
            "credentials", "routed", "gate", "mark", "admit", "answer")


def named(cell: str) -> list[tuple[int | None, str]]:
    """The functions a cell names, each with its number (None: unnumbered)."""
    return [(int(n) if n else None, name) for n, name in re.findall(r"(?:(\d+) )?\(?([A-Za-z_.]*[a-z])\b", cell)
            if "_" in name or name in ONE_WORD]


#: how the stages call a feature's part: ``module.part(...)``, ``state.part(...)`` (money's, on the call's
#: state) or one of settle's own helpers, which stands for the part it runs
ALIASES = {"resources": "owned resources", "jobs": "async jobs", "capacity_stage": "capacity",
           "overflow_stage": "overflow", "archive": "archive", "state": "money", "reserve": "money",
           "table": "/table/", "demo": "public demo", "hub_stage": "hub", "hub_views": "hub"}
HELPERS = {"_overflow": ("overflow", "after_direct"), "_close_hold": ("money", "close_hold")}


def parts_called(fn: object) -> list[tuple[str, str]]:
    """(feature, part) of every feature part ``fn`` calls, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ALIASES:
            found.append((node.lineno, node.col_offset, (ALIASES[f.value.id], f.attr)))
        elif isinstance(f, ast.Name) and f.id in HELPERS:
            found.append((node.lineno, node.col_offset, HELPERS[f.id]))
    return [part for _, _, part in sorted(found)]


def test_the_table_has_every_feature_and_stage():
    titles, rows = table()
    assert titles == ["feature", "1-3", "after 3", "4 reserve", "5 relay", "6 settle", "7 the exit"]
    assert set(rows) == set(FEATURES)


def test_every_function_the_table_names_is_its_feature_modules():
    _, rows = table()
    missing = []
    for feature, columns in rows.items():
        for cell in columns.values():
            for _, name in named(cell):
                owner, _, attr = name.rpartition(".")
                homes = [getattr(home, owner) if owner else home for home in FEATURES[feature]
                         if not owner or hasattr(home, owner)]
                if name == "close_hold":  # settle's helper that closes money's hold
                    homes = [settle]
                    attr = "_close_hold"
                if name == "place_hold":  # money's hold, placed through treg.money by the reserve stage
                    homes, attr = [reserve.money], "place_hold"
                if not any(hasattr(home, attr) for home in homes):
                    missing.append(f"{feature}: {name}")
    assert missing == []


def test_every_feature_part_the_stages_call_is_in_its_row():
    _, rows = table()
    in_table = {(feature, name.rpartition(".")[2]) for feature, columns in rows.items()
                for cell in columns.values() for _, name in named(cell)}
    called = (parts_called(service.execute) + parts_called(settle._metered_outcome) + parts_called(settle._overflow)
              + parts_called(service.answer))
    # the state's own bookkeeping is no feature's part
    absent = [part for part in called if part not in in_table and part[0] != "money"]
    assert absent == []
    assert ("money", "store_for_replay") in called and ("money", "close_hold") in called
    assert {("/table/", "intake"), ("/table/", "settles"), ("/table/", "finish"), ("public demo", "mark")} <= set(called)


def test_the_parts_other_stages_call_are_in_the_table():
    """/table/'s and the public demo's parts called from execute, resolve, the catalog half, reserve, an
    overflow's hold and the exit are each in their row (their "1-3", "4 reserve" and "7 the exit" cells)."""
    _, rows = table()
    in_table = {(feature, name.rpartition(".")[2]) for feature, columns in rows.items()
                for cell in columns.values() for _, name in named(cell)}
    called = [part for fn in (service.execute, resolve.resolve_target, catalog_stage.target_for,
                              reserve.reserve, overflow_stage._serve, record._unwind, record.exit_call)
              for part in parts_called(fn) if part[0] in ("/table/", "public demo")]
    assert {part[1] for part in called} >= {"screen", "check_endpoint", "credentials", "routed", "not_offered",
                                            "gate", "hold_cap", "give_back", "refusal_headers"}
    assert [part for part in called if part not in in_table] == []


@pytest.mark.parametrize("column, fn", [("after 3", service.execute), ("6 settle", settle._metered_outcome)])
def test_the_numbers_are_the_order_the_stage_calls_them(column, fn):
    _, rows = table()
    numbered = sorted((n, feature, name) for feature, columns in rows.items()
                      for n, name in named(columns.get(column, "")) if n is not None)
    expected = [(feature, name) for _, feature, name in numbered]
    assert [n for n, _, _ in numbered] == list(range(1, len(numbered) + 1))  # 1, 2, 3… no gap, no twice
    assert [part for part in parts_called(fn) if part in expected] == expected


# -- the capacity stage's send: the platform tier only ---------------------------------------------------

async def test_only_a_platform_tier_call_is_sent_through_the_capacity_stage(env, monkeypatch):
    """``capacity_stage.send`` (the spacer, the burst re-send) is a platform-tier call's send only: an own
    tool's call and a team-tier catalog call are sent with the relay's plain send."""
    gw, up, events = env
    sent_through: list[str] = []

    async def capacity_send(svc, state):
        sent_through.append(str(state.target.credential_tier))
        return await relay.send(svc, state)

    monkeypatch.setattr(capacity_stage, "send", capacity_send)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")  # treg's key: the platform tier
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "platform"
    r = await gw.call("GET", "/call/t/x")  # an own tool's call
    assert r.status == 200 and "X-Treg-Credential-Tier" not in r.headers
    await gw.secret("team-key", provider="acme")
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=2")  # the org's own key: the team tier
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert sent_through == ["platform"]
    assert len(up.exchanges) == 3  # every one of them reached the upstream
