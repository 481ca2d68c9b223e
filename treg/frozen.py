"""``@frozen_value``: a frozen dataclass whose ``__init__`` costs what a plain one does.

The call pipeline hands frozen dataclasses from stage to stage (``CallInput``, ``ResolvedTarget``,
``UpstreamRequest``…), several per call. A frozen dataclass's generated ``__init__`` stores every
field through ``object.__setattr__`` (it must get past the class's own ``__setattr__``, which refuses),
several times slower than writing the instance ``__dict__`` directly (a speed trick: the figures are
in docs/performance.md). This decorator is ``dataclass(frozen=True)`` (same fields, repr,
equality, hash, ``dataclasses.replace``, assignment still refused) with that ``__init__`` generated
in its place, the way ``dataclasses`` generates its own. Classes with ``__slots__`` have no
``__dict__`` and are refused.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_FACTORY = object()  # the default of a parameter whose field has a default_factory


def frozen_value(cls: type[T] | None = None, /, **options: Any) -> Any:
    """Use as ``@frozen_value`` or ``@frozen_value(eq=False, …)`` (any ``dataclass`` option but frozen)."""
    def wrap(klass: type[T]) -> type[T]:
        klass = dataclasses.dataclass(frozen=True, **options)(klass)
        if "__slots__" in klass.__dict__:
            raise TypeError(f"{klass.__name__}: frozen_value writes __dict__; a slotted class has none")
        klass.__init__ = _fast_init(klass)  # type: ignore[misc]
        return klass

    return wrap if cls is None else wrap(cls)


def _fast_init(klass: type) -> Callable[..., None]:
    ns: dict[str, Any] = {"_FACTORY": _FACTORY}
    params: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(klass):
        if f.kw_only:
            raise TypeError(f"{klass.__name__}.{f.name}: frozen_value supports plain fields only")
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        if has_default:
            ns[f"_default_{f.name}"] = f.default
        if has_factory:
            ns[f"_factory_{f.name}"] = f.default_factory
        if not f.init:
            if has_default:
                body.append(f"d[{f.name!r}] = _default_{f.name}")
            elif has_factory:
                body.append(f"d[{f.name!r}] = _factory_{f.name}()")
            continue  # else __post_init__ sets it
        if has_default:
            params.append(f"{f.name}=_default_{f.name}")
        elif has_factory:
            params.append(f"{f.name}=_FACTORY")
            body.append(f"if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"d[{f.name!r}] = {f.name}")
    if hasattr(klass, "__post_init__"):
        body.append("self.__post_init__()")
    src = f"def __init__(self, {', '.join(params)}):\n    d = self.__dict__\n"
    src += "".join(f"    {line}\n" for line in body) or "    pass\n"
    exec(src, ns)  # noqa: S102 (generated from the class's own field names, as dataclasses does)
    init = ns["__init__"]
    # dataclasses' own __init__ takes exactly these parameters, or the class uses something this does
    # not generate (an InitVar: not among fields())
    if list(inspect.signature(klass.__init__).parameters)[1:] != [p.split("=")[0] for p in params]:
        raise TypeError(f"{klass.__name__}: frozen_value supports plain fields only")
    init.__qualname__ = f"{klass.__qualname__}.__init__"
    return init  # type: ignore[no-any-return]
