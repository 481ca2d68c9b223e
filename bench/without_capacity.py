"""``python bench/without_capacity.py serve``: ``treg serve`` with issue 11's call-path stages taken out.

Not part of treg: the reference of the benchmark's platform case (bench/platform_case.py, docs/performance.md
"The platform tier without a lock"). What issue 11 put on the path of a platform-tier catalog call is
replaced by what the pipeline did before it, everything else is this checkout's treg:

* ``capacity_stage.check_lock`` (the lock view read between authorize and reserve): nothing;
* ``capacity_stage.send`` (the per-provider spacer, the one re-send of a burst 429; ``service.execute``
  calls it for platform-tier calls only): the relay's send;
* ``capacity_stage.after_answer`` (the answer's classification, the breaker's writes): nothing (its
  headers are ``CallState.catalog_headers``', empty without the lock check and the spacer);
* ``overflow_stage.instead_of_direct`` and ``after_direct`` (an aggregator instead of, or after, the
  direct attempt): never.

Both processes run the same code otherwise, on the same database, so the difference between them is
what those stages cost a call whose provider is not locked.
"""

import os
import sys
from typing import Any

# run as a script, its folder comes first on sys.path: the benchmark's modules must not shadow the
# standard library's for treg (bench/ is not a package treg imports from)
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

from treg.call import capacity_stage, overflow_stage, relay  # noqa: E402


async def _no_lock_check(svc: Any, state: Any, overflows: Any = None) -> None:
    return None


async def _plain_send(svc: Any, state: Any) -> Any:
    return await relay.send(svc, state)


async def _no_breaker(svc: Any, state: Any, resp: Any, body_head: bytes) -> None:
    return None


async def _no_overflow(svc: Any, state: Any, *rest: Any) -> None:
    return None


_REPLACED = ((capacity_stage, "check_lock", _no_lock_check), (capacity_stage, "send", _plain_send),
             (capacity_stage, "after_answer", _no_breaker), (overflow_stage, "instead_of_direct", _no_overflow),
             (overflow_stage, "after_direct", _no_overflow))
for module, name, replacement in _REPLACED:
    if not callable(getattr(module, name, None)):
        # a stage renamed or gone: the reference would silently keep it, and the case measure nothing
        raise SystemExit(f"bench/without_capacity.py: {module.__name__}.{name} is not there any more")
    setattr(module, name, replacement)

sys.argv = ["treg", *sys.argv[1:]]

from treg.cli import main  # noqa: E402 (after the stages are replaced)

raise SystemExit(main())
