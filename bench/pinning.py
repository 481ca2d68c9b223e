"""CPU placement: the relay under test alone on one CPU, everything else on the others."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from bench.database import BenchDatabase


def cpu_plan(mode: str) -> tuple[set[int], set[int]] | None:
    """``--pin auto``: with two CPUs or more, (the relay's CPU, every other CPU); else None (no pinning)."""
    if mode == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[0]}, set(cpus[1:])


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it from their creator)."""
    tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")] if os.path.isdir(f"/proc/{pid}/task") else [pid]
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, cpus)


def _parent(pid: int | str) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _postmaster_family(postmaster: int) -> list[int]:
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if _parent(entry) == postmaster:
                    pids.append(int(entry))
    return pids


@contextlib.contextmanager
def database_pinned(db: BenchDatabase, cpus: set[int]) -> Iterator[None]:
    """PostgreSQL's postmaster and its children on ``cpus`` while the block runs (backends forked
    meanwhile inherit it), then back where they were.

    Only a server the benchmark started itself (``db.owned``) is touched: one it was given (``--dsn``,
    ``TREG_DATABASE_URL``) may be shared, by a test session or anyone else, and moving its processes
    would move theirs."""
    postmaster = db.postmaster
    before = None
    if postmaster is not None:
        with contextlib.suppress(OSError):
            before = os.sched_getaffinity(postmaster)
    if postmaster is None or before is None:
        yield
        return
    for pid in _postmaster_family(postmaster):
        pin(pid, cpus)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            for pid in _postmaster_family(postmaster):
                pin(pid, before)
