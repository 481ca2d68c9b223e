"""Import each given module first, in a process of its own: the harness of tests/test_circular_imports.py.

Run as a script, ``python -I <this file>``, never as ``-m treg.testing.import_each`` (that would import
treg first), with a JSON request on stdin (``-I``: its own folder is not on ``sys.path``, so this package's
``dns`` or ``settings`` cannot stand in for another's):

* ``{"mode": "deps", "modules": [...]}`` imports them all and prints (JSON) every other module that
  got loaded: the dependencies, none of them ``ours``;
* ``{"mode": "check", "modules": [...], "preload": [...]}`` imports the dependencies once, then forks
  one child per module, which imports that module first of all of ``ours`` and reports the traceback
  of any failure or warning; prints ``{module: traceback or null}``.

aiohttp starts a whole interpreter per module; forking a process that already holds the third-party
dependencies tests the same thing for the cycles that matter here (between our own modules) at a
fraction of the CPU: ~90 interpreters importing aiohttp, SQLAlchemy and alembic cost over a minute.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import warnings


def is_ours(name: str, ours: list[str]) -> bool:
    return name.split(".")[0] in ours


def dependencies(modules: list[str], ours: list[str]) -> list[str]:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # its own child reports it; here only what it loads on the way counts
            pass
    return sorted(n for n in sys.modules if not is_ours(n, ours) and n != "__main__")


def preload(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # an alias entry of sys.modules, a platform-only module: the child imports it
            pass


def first_import(module: str, ours: list[str]) -> str | None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of ours is loaded yet, so ``module`` is the first
        os.close(read)
        status = 1
        try:
            loaded = [n for n in sys.modules if is_ours(n, ours)]
            assert not loaded, f"already loaded before {module}: {loaded}"
            warnings.simplefilter("error")  # aiohttp's choice: a warning at import time is a failure
            for category in (DeprecationWarning, PendingDeprecationWarning):  # a dependency's own
                warnings.filterwarnings("ignore", category=category)
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            importlib.import_module(module)
            status = 0
        except BaseException:
            os.write(write, traceback.format_exc().encode(errors="replace"))
        finally:
            os._exit(status)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return b"".join(chunks).decode(errors="replace") or f"exit status {status}"


def main() -> None:
    request = json.load(sys.stdin)
    sys.path[:0] = request.get("path", [])
    ours = request["ours"]
    if request["mode"] == "deps":
        print(json.dumps(dependencies(request["modules"], ours)))
        return
    preload(request["preload"])
    print(json.dumps({m: first_import(m, ours) for m in request["modules"]}))


if __name__ == "__main__":
    main()
