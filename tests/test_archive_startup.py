"""Classifier rows and endpoint ``archive`` rows are validated once at startup: a bad or duplicate row stops
treg naming the plugin, the row and the field; migration 0010 matches the schema and reverses."""

from __future__ import annotations


import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from treg import plugins, testing
from treg.app import create_app
from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog
from treg.infra import migrate
from treg.infra.schema import metadata
from treg.results import HIT, MISS, UNKNOWN, build_classifiers
from treg.testing import ProviderPlugin, assert_up_down_up
from treg.testing.vendors.archive import CLASSIFIER_PLUGIN, people_provider, write_classifier_plugin


@pytest.fixture(scope="module")
def catalog():
    pm = plugins.create_manager()
    return build_catalog([("people-plugin", [people_provider("https://people.example")])],
                         plugins.collect_injectors(pm), {})


def _problems(rows, catalog, plugin="p"):
    with pytest.raises(CatalogError) as err:
        build_classifiers([(plugin, rows)], catalog)
    return [(p.plugin, p.row, p.field) for p in err.value.problems]


def test_bad_classifier_rows_name_plugin_row_and_field(catalog):
    assert _problems([{"endpoint": "people.nope", "hit": {"path": "a", "nonempty": True}}], catalog) == [
        ("p", "classifier #0 (people.nope)", "endpoint")]
    assert _problems([{"endpoint": "people.find", "hit": {"path": "a", "nonempty": False}}], catalog) == [
        ("p", "classifier #0 (people.find)", "hit.nonempty")]
    assert _problems([{"endpoint": "people.find", "hit": {"path": "a", "empty": True, "equals": 1}}], catalog) == [
        ("p", "classifier #0 (people.find)", "hit")]
    assert _problems([{"endpoint": "people.find", "miss": {"path": "a..b", "empty": True}}], catalog) == [
        ("p", "classifier #0 (people.find)", "miss.path")]
    assert _problems([{"endpoint": "people.find", "hit": {"path": "a", "in": []}}], catalog) == [
        ("p", "classifier #0 (people.find)", "hit.in")]
    assert _problems([{"endpoint": "people.find", "hit": {"path": "a", "nonempty": True},
                       "admit_misses": True}], catalog) == [("p", "classifier #0 (people.find)", "admit_misses")]
    assert _problems([{"endpoint": "people.find"}], catalog) == [("p", "classifier #0 (people.find)", "")]
    assert _problems([{"endpoint": "people.find", "hit": {"path": "a", "nonempty": True}, "colour": 1}],
                     catalog) == [("p", "classifier #0 (people.find)", "colour")]
    assert _problems({"endpoint": "people.find"}, catalog) == [("p", "treg_register_result_classifiers", "")]


def test_a_second_classifier_for_one_endpoint_stops_startup(catalog):
    row = {"endpoint": "people.find", "hit": {"path": "data.emails", "nonempty": True}}
    with pytest.raises(CatalogError) as err:
        build_classifiers([("first", [row]), ("second", [row])], catalog)
    (p,) = err.value.problems
    assert (p.plugin, p.row, p.field) == ("second", "classifier #0 (people.find)", "endpoint")
    assert "'first'" in p.message


def test_the_predicates(catalog):
    reg = build_classifiers([("p", [
        {"endpoint": "people.find", "hit": {"path": "data.emails", "nonempty": True},
         "miss": {"path": "data.emails", "empty": True}},
        {"endpoint": "people.plain", "hit": {"path": "status", "equals": "found"},
         "miss": {"path": "status", "in": ["none", "gone"]}},
        {"endpoint": "people.public", "hit": {"path": "items.0.id", "nonempty": True}},
    ])], catalog)
    find, plain, public = (reg.get(e) for e in ("people.find", "people.plain", "people.public"))
    assert find.classify({"data": {"emails": ["a"]}}) == HIT
    assert [find.classify(a) for a in ({"data": {"emails": []}}, {"data": {"emails": None}},
                                       {"data": {"emails": ""}})] == [MISS] * 3
    assert [find.classify(a) for a in ({"data": {}}, {"data": "x"}, None, "text", 3)] == [UNKNOWN] * 5
    assert find.classify({"data": {"emails": 0}}) == HIT  # a number is a value, not an empty result
    assert [plain.classify({"status": s}) for s in ("found", "none", "gone", "later")] == [HIT, MISS, MISS, UNKNOWN]
    assert plain.classify({"status": True}) == UNKNOWN  # equals compares the JSON type too
    assert public.classify({"items": [{"id": 7}]}) == HIT and public.classify({"items": []}) == UNKNOWN
    assert find.paths == ("data.emails",) and reg.get("people.lookup") is None


@pytest.mark.parametrize("archive,field", [
    ({"ttl_s": 0}, "archive.ttl_s"),
    ({"ttl_s": "60"}, "archive.ttl_s"),
    ({"ttl_s": 60, "cache_price": "half"}, "archive.cache_price"),
    ({"ttl_s": 60, "cache_price": "repeat"}, "archive.repeat_price_micro"),
    ({"ttl_s": 60, "cache_price": "repeat", "repeat_price_micro": 2001}, "archive.repeat_price_micro"),
    ({"ttl_s": 60, "repeat_price_micro": 5}, "archive.repeat_price_micro"),
    ({"ttl_s": 60, "scope": "world"}, "archive.scope"),
    ({"ttl_s": 60, "tll_s": 1}, "archive.tll_s"),
    ([60], "archive"),
])
def test_bad_archive_rows_name_the_field(archive, field):
    row = people_provider("https://people.example")
    row["endpoints"] = [dict(row["endpoints"][0], archive=archive)]
    with pytest.raises(CatalogError) as err:
        build_catalog([("people-plugin", [row])], plugins.collect_injectors(plugins.create_manager()), {})
    assert [(p.plugin, p.row, p.field) for p in err.value.problems] == [
        ("people-plugin", "endpoint 'people.find'", field)]


def test_an_archive_on_a_write_or_a_spooled_row_is_refused():
    row = people_provider("https://people.example")
    row["endpoints"] = [{"id": "people.drop", "method": "DELETE", "path": "/x", "params": [],
                         "price": {"per_call_micro": 1}, "archive": {"ttl_s": 5}},
                        {"id": "people.media", "method": "POST", "path": "/m", "params": [],
                         "price": {"per_call_micro": 1}, "spooled_response": True, "archive": {"ttl_s": 5}}]
    with pytest.raises(CatalogError) as err:
        build_catalog([("pp", [row])], plugins.collect_injectors(plugins.create_manager()), {})
    assert [(p.row, p.field) for p in err.value.problems] == [("endpoint 'people.drop'", "archive"),
                                                             ("endpoint 'people.media'", "archive")]


def test_a_valid_row_is_kept_on_the_endpoint(catalog):
    ep = catalog.get("people.find_repeat")
    assert ep.archive.to_json() == {"ttl_s": 3600, "cache_price": "repeat", "scope": "org",
                                    "repeat_price_micro": 500}
    assert catalog.get("people.public").archive.scope == "global" and catalog.get("people.plain").archive is None


def test_startup_loads_a_classifier_file_and_refuses_a_bad_one(tmp_path, dsn):
    provider = ProviderPlugin([people_provider("https://people.example")])
    good = write_classifier_plugin(tmp_path / "good")
    settings = testing.make_settings(tmp_path / "home", plugins_dir=good)
    create_app(settings, dsn=dsn, extra_plugins=(provider,))  # validated at build time
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "classes.py").write_text(CLASSIFIER_PLUGIN.replace('"people.classified"', '"people.classifed"'))
    with pytest.raises(CatalogError) as err:
        create_app(testing.make_settings(tmp_path / "home2", plugins_dir=bad), dsn=dsn, extra_plugins=(provider,))
    assert [(p.plugin, p.row, p.field) for p in err.value.problems] == [
        ("dir:classes.py", "classifier #4 (people.classifed)", "endpoint")]
    raising = tmp_path / "raising"
    raising.mkdir()
    (raising / "boom.py").write_text("from treg import hookimpl\n\n@hookimpl\n"
                                     "def treg_register_result_classifiers():\n    raise RuntimeError('nope')\n")
    with pytest.raises(CatalogError) as err:
        create_app(testing.make_settings(tmp_path / "home3", plugins_dir=raising), dsn=dsn)
    assert [(p.plugin, p.row) for p in err.value.problems] == [("dir:boom.py", "treg_register_result_classifiers")]


TABLES = {"archive_entries"}


def test_schema_matches_migration(dsn):
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert TABLES <= set(inspect(conn).get_table_names())
        columns = {c["name"] for c in inspect(conn).get_columns("calls")}
    assert {"result_state", "cache_state"} <= columns
    mine = [d for d in diffs if "archive_entries" in repr(d) or "result_state" in repr(d) or "cache_state" in repr(d)]
    assert mine == []


def test_0010_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0010", "0010_archive", {"archive_entries"},
                      columns={"calls": {"result_state", "cache_state"}})


def test_the_endpoint_listing_shows_its_archive(catalog):
    assert catalog.get("people.find_free").to_json()["archive"] == {"ttl_s": 3600, "cache_price": "free",
                                                                    "scope": "org"}
    assert catalog.get("people.plain").to_json()["archive"] is None


def test_an_archived_row_may_not_be_an_async_submission_or_act_on_an_owned_object():
    from treg.catalog.errors import CatalogError
    from treg.testing import build_catalog_of, contract_provider

    for extra in ({"async": {"task_id": "id", "poll": "acme.items.get", "task_param": "item_id",
                             "status_path": "status", "done": ["done"], "failed": ["failed"]}},
                  {"managed_resource": {"kind": "item", "role": "create", "id_path": "id"}}):
        data = contract_provider()
        data["endpoints"][1].update(archive={"ttl_s": 60}, **extra)
        with pytest.raises(CatalogError) as info:
            build_catalog_of(data)
        assert any(p.field == "archive" and "never archived" in p.message for p in info.value.problems), \
            info.value.problems


@pytest.mark.parametrize("utility", ["vidgen.tasks.get", "vidgen.files.get"])
def test_an_archive_on_an_async_poll_or_fetch_stops_startup(tmp_path, dsn, utility):
    """A poll answered from the archive would read a stale status (a fetch is streamed, never stored):
    the row is refused at startup, naming the plugin, the row and the field."""
    from treg.testing.vendors.async_jobs import PLUGIN

    folder = tmp_path / "plugins"
    folder.mkdir()
    row = f'{{{{"id": "{utility}", '
    source = PLUGIN.replace(row, row + '"archive": {{"ttl_s": 60}}, ')
    assert source != PLUGIN
    (folder / "vidgen.py").write_text(source.format(base_url="https://vidgen.example/v1"))
    with pytest.raises(CatalogError) as err:
        create_app(testing.make_settings(tmp_path / "home", plugins_dir=folder), dsn=dsn)
    assert [(p.plugin, p.row, p.field) for p in err.value.problems] == [
        ("dir:vidgen.py", f"endpoint {utility!r}", "archive")]
    assert "never archived" in err.value.problems[0].message
