"""docs/plugins.md documents every hook of treg/hookspecs.py with the same parameters and the same
failure policy, and documents no hook that does not exist (the model is Datasette's tests/test_docs.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

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
