"""docs/plugins.md documents every hook of treg/hookspecs.py with the same parameters and the same
failure policy, and documents no hook that does not exist (the model is Datasette's tests/test_docs.py)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from treg import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def hook_sections(text: str) -> dict[str, str]:
    """``### <hook>`` heading -> its section text, under ``## Hooks`` (up to the next ``## ``)."""
    match = re.search(r"^## Hooks\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{DOC} has no '## Hooks' section"
    parts = re.split(r"^### (\S+)\s*$", match.group(1), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def documented_params(name: str, section: str) -> list[str]:
    """The parameter names of the section's first `` `name(a, b) -> …` `` signature."""
    sig = re.search(rf"`{re.escape(name)}\(([^)]*)\)", section)
    assert sig, f"docs/plugins.md § {name}: no `{name}(...)` signature in its section"
    params = [p.strip() for p in sig.group(1).split(",") if p.strip()]
    return [re.split(r"[:=\s]", p, maxsplit=1)[0] for p in params]


SECTIONS = hook_sections(DOC.read_text())


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_hook_is_documented_with_its_parameters_and_policy(name):
    assert name in SECTIONS, f"hook {name} of treg/hookspecs.py has no '### {name}' under '## Hooks' in docs/plugins.md"
    section = SECTIONS[name]
    expected = list(inspect.signature(getattr(hookspecs, name)).parameters)
    assert documented_params(name, section) == expected, \
        f"docs/plugins.md § {name} documents {name}({', '.join(documented_params(name, section))}), " \
        f"treg/hookspecs.py declares {name}({', '.join(expected)})"
    word = {hookspecs.CONTAINED: r"\bcontained\b", hookspecs.FAIL_CLOSED: r"\bfail[- ]closed\b"}[hookspecs.policy_of(name)]
    assert re.search(word, section, re.I), \
        f"docs/plugins.md § {name} must say the hook is {hookspecs.policy_of(name).value} (as treg/hookspecs.py declares)"


def test_every_documented_hook_exists():
    unknown = sorted(set(SECTIONS) - set(hookspecs.hook_names()))
    assert unknown == [], f"docs/plugins.md documents hooks treg/hookspecs.py does not declare: {unknown}"


def test_the_parser_sees_a_wrong_signature():
    # the check itself must be able to fail: a renamed parameter is caught
    text = "## Hooks\n\n### treg_event\n\n`treg_event(evt) -> None`. Contained.\n\n## Next\n"
    assert documented_params("treg_event", hook_sections(text)["treg_event"]) == ["evt"]
    assert list(hook_sections(text)) == ["treg_event"]


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_hook_docstring_says_when_what_and_none(name):
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert re.search(r"\bcalled\b", doc, re.I), f"{name}: the docstring says when it is called"
    assert re.search(r"\breturns?\b", doc, re.I), f"{name}: the docstring says what it returns"
    assert "None" in doc, f"{name}: the docstring says what None means"
    word = {hookspecs.CONTAINED: r"\bcontained\b", hookspecs.FAIL_CLOSED: r"\bfail[- ]closed\b"}[hookspecs.policy_of(name)]
    assert re.search(word, doc, re.I), f"{name}: the docstring states its policy"


# -- docs/architecture.md names only what exists -------------------------------------------------------

ROOT = DOC.parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: where a name the map mentions may live (sources, packaging); not tests/: the map names no test helper
SOURCES = [p for folder in ("treg", "plugins", "migrations", "bench") for p in (ROOT / folder).rglob("*.py")]
SOURCES += [ROOT / "setup.py", ROOT / "pyproject.toml"]
PATH = re.compile(r"^(treg|plugins|migrations|bench|templates|tests|docs)(/[\w.*-]+)*/?$")
FILE = re.compile(r"^[\w*]+\.py$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
IDENT = re.compile(r"^[A-Za-z_]\w*$")
#: dotted spans that are not code: a host name, a file name
PROSE = {"localhost.localdomain", "secret.key.previous"}
#: names of other projects the map points at, and the module that has each
EXTERNAL = {"_serialize_headers": "aiohttp.http_writer"}


def code_spans(text: str) -> list[str]:
    """Every `inline code` of a Markdown text (fenced blocks left out: they are read separately)."""
    inline = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    parts = inline.split("`")
    assert len(parts) % 2 == 1, "an unpaired backtick"
    return [" ".join(p.split()) for p in parts[1::2]]


def _glob(pattern: str) -> list[Path]:
    return list(ROOT.glob(pattern.rstrip("/").replace("NNNN", "[0-9][0-9][0-9][0-9]")))


def _module_named(last: str) -> list[Any]:
    """The treg modules whose last dotted part is ``last`` (``intake`` → ``treg.call.intake``)."""
    out = []
    for path in (ROOT / "treg").rglob(f"{last}.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        out.append(importlib.import_module(".".join(rel.parts)))
    if (ROOT / "treg" / last / "__init__.py").is_file() or last == "treg":
        out.append(importlib.import_module("treg" if last == "treg" else f"treg.{last}"))
    return out


def _resolves(dotted: str) -> bool:
    """``treg.a.b.Name.attr``: the longest importable module prefix, then attributes; ``mod.attr``: a treg
    module named ``mod`` has ``attr``; ``svc.field``: a field of Services; ``Class.attr``: both in sources."""
    head, *rest = dotted.split(".")
    if head == "treg":
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return False
            return True
        return False
    if head == "svc":
        from treg.context import Services

        obj: Any = {f.name: f.type for f in dataclasses.fields(Services)}
        return rest[0] in obj
    if head[0].isupper():
        return all(_in_sources(word) for word in (head, *rest))
    for module in _module_named(head):
        obj = module
        try:
            for attr in rest:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return True
    return False


_TEXT: list[str] = []


def _in_sources(word: str) -> bool:
    if not _TEXT:
        _TEXT.append("\n".join(p.read_text() for p in SOURCES))
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", _TEXT[0]) is not None


def dangling(spans: list[str]) -> list[str]:
    out = []
    for span in dict.fromkeys(spans):
        command = re.fullmatch(r"python -m ([\w.]+)", span)
        call = re.fullmatch(r"([A-Za-z_][\w.]*)\(.*\)", span)  # `execute()`, `create_app(settings)`
        name = call.group(1) if call else span
        if span in PROSE:
            continue
        if command:
            ok = importlib.util.find_spec(command.group(1)) is not None
        elif name in EXTERNAL:
            ok = hasattr(importlib.import_module(EXTERNAL[name]), name)
        elif PATH.match(span):
            ok = bool(_glob(span))
        elif FILE.match(span):
            ok = any(_glob(f"{folder}/**/{span}") for folder in ("treg", "plugins", "migrations", "bench")) or (
                ROOT / span).is_file()
        elif DOTTED.match(name) and not FILE.match(name):
            ok = _resolves(name)
        elif IDENT.match(name) and ("_" in name or name[0].isupper()):
            ok = _in_sources(name)
        else:
            continue  # prose in code: a header, a status, a URL, a value
        if not ok:
            out.append(span)
    return out


def test_every_name_the_architecture_map_mentions_exists():
    """Every module path, file, dotted name and identifier docs/architecture.md puts in backticks is in
    the code as written, so the map cannot drift from the territory unnoticed."""
    assert dangling(code_spans(ARCHITECTURE.read_text())) == []


def test_the_name_check_sees_a_dangling_name():
    spans = ["treg/call/evidence.py", "treg/no_such_module.py", "tests/test_no_such_helpers.py",
             "treg.factory.build_services", "treg.factory.open_services", "intake.identify", "intake.no_such_step",
             "svc.audit", "svc.pm_registries", "record.py", "evidence_stage.py", "NullAuditWriter",
             "NullMetricsWriter", "load_org_credentials", "load_org_secrets_twice", "python -m bench.instructions",
             "python -m bench.nothing", "create_app(settings)", "X-Treg-Token", "/call/<tool>/<path>"]
    assert dangling(spans) == ["treg/no_such_module.py", "tests/test_no_such_helpers.py",
                               "treg.factory.open_services", "intake.no_such_step", "svc.pm_registries",
                               "evidence_stage.py", "NullMetricsWriter", "load_org_secrets_twice",
                               "python -m bench.nothing"]


def test_the_pipeline_diagram_names_the_stages_the_map_lists():
    """The layer diagram's stage chain is the numbered stage list of "The call pipeline", in order."""
    text = ARCHITECTURE.read_text()
    diagram = re.search(r"^```\n(.*?)^```", text, re.M | re.S)
    assert diagram
    lines = diagram.group(1).splitlines()
    start = next(i for i, line in enumerate(lines) if "(pipeline)" in line) + 1
    chain: list[str] = []
    for line in lines[start:]:
        first = re.split(r"\s{2,}", line.strip())[0]  # the pipeline's column
        if not re.search(r"\w", first):
            break
        chain += [w.strip() for w in first.split("→") if w.strip()]
    stages = [s.lower() for s in re.findall(r"^\d+\. \*\*(\w+)\*\*", text, re.M)]
    assert chain == stages and len(stages) == 7
