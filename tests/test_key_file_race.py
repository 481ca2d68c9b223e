"""Two treg processes starting together on one fresh TREG_HOME must agree on one master key: the key
file is created whole and once (the loser of the race reads the winner's), never a FileExistsError or a
half-written file (seen in tests/test_shared_home.py under load)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from treg.infra import crypto
from treg.settings import Settings


def _load(home: str, barrier, out) -> None:
    barrier.wait()
    try:
        box = crypto.load_box(Settings(home=Path(home)))
        out.put(box.key_id)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(repr(exc))


def test_processes_racing_on_a_fresh_home_share_one_key(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        home = tmp_path / f"home{round_}"
        n = 6
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_load, args=(str(home), barrier, out)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        got = [out.get(timeout=5) for _ in range(n)]
        assert len(set(got)) == 1 and not got[0].startswith(("FileExistsError", "Bad", "Config")), got
        assert [p.name for p in home.iterdir()] == ["secret.key"]  # no temporary file left behind
        assert (home / "secret.key").stat().st_mode & 0o777 == 0o600
