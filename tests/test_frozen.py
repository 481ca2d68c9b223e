"""@frozen_value behaves as dataclass(frozen=True), only its __init__ is cheaper."""

import dataclasses

import pytest

from treg.frozen import frozen_value


@frozen_value
class Sample:
    a: str
    b: int = 2
    items: tuple[str, ...] = ()
    tags: list[str] = dataclasses.field(default_factory=list)
    hidden: str = dataclasses.field(default="h", init=False, repr=False, compare=False)


@frozen_value
class Derived:
    raw: str
    upper: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper", self.raw.upper())


def test_same_behaviour_as_a_frozen_dataclass():
    s = Sample("x")
    assert (s.a, s.b, s.items, s.tags, s.hidden) == ("x", 2, (), [], "h")
    assert Sample("x", 3, ("i",), ["t"]) == Sample(a="x", b=3, items=("i",), tags=["t"])
    assert Sample("x").tags is not Sample("x").tags  # a fresh default from the factory each time
    assert repr(Sample("x")) == "Sample(a='x', b=2, items=(), tags=[])"
    assert hash(Sample("x", tags=None)) == hash(Sample("x", tags=None))  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.a = "y"  # type: ignore[misc]
    assert dataclasses.replace(s, b=5) == Sample("x", 5)
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Sample("x", hidden="no")  # type: ignore[call-arg]
    assert Derived("ab").upper == "AB" and dataclasses.replace(Derived("ab"), raw="cd").upper == "CD"


def test_what_it_cannot_generate_is_refused():
    with pytest.raises(TypeError):
        @frozen_value
        class WithInitVar:  # noqa: F811
            a: dataclasses.InitVar[int]

    with pytest.raises(TypeError):
        @frozen_value(kw_only=True)
        class KwOnly:
            a: int

    with pytest.raises(TypeError):
        @frozen_value(slots=True)
        class Slotted:
            a: int
