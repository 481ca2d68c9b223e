"""Identifiers (treg/ids.py): the prefix and 128 CSPRNG bits as 32 hex digits, unique, read from the
operating system in blocks (not one system call per id), and never shared with a forked child; a call's id
the same shape, its first 48 bits the time in milliseconds and 80 random bits after them."""

from __future__ import annotations

import os
import re
import time

from treg import ids


def test_an_id_is_the_prefix_and_32_hex_digits():
    assert re.fullmatch(r"call_[0-9a-f]{32}", ids.new_id("call"))
    assert re.fullmatch(r"org_[0-9a-f]{32}", ids.new_id("org"))


def test_ids_are_unique_across_blocks():
    made = [ids.new_id("x") for _ in range(ids.BLOCK * 5 + 3)]
    assert len(set(made)) == len(made)


def test_the_random_source_is_read_once_per_block(monkeypatch):
    reads: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(ids.os, "urandom", counting)
    pool = ids._Pool()
    taken = [pool.take() for _ in range(ids.BLOCK * 3 + 1)]
    assert reads == [ids.BLOCK * 16] * 4
    assert all(len(t) == 16 for t in taken) and len(set(taken)) == len(taken)


def test_a_forked_child_does_not_repeat_its_parents_ids():
    ids.new_id("warm")  # the parent holds a block with ids still to hand out
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent, then out without any cleanup of the test's
        try:
            os.write(write, ",".join(ids.new_id("c") for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        child = fh.read().split(",")
    os.waitpid(pid, 0)
    parent = [ids.new_id("c") for _ in range(4)]
    assert len(child) == 4 and not set(child) & set(parent)


def test_a_call_id_is_shaped_like_any_id_and_begins_with_its_time():
    before = time.time_ns() // 1_000_000
    call_id = ids.new_call_id()
    after = time.time_ns() // 1_000_000
    assert re.fullmatch(r"call_[0-9a-f]{32}", call_id) and ids.PLAIN_ID.fullmatch(call_id)
    assert before <= int(call_id[5:17], 16) <= after


def test_call_ids_sort_in_the_order_they_were_made_and_stay_unguessable(monkeypatch):
    clock = iter(range(1_700_000_000_000_000_000, 1_800_000_000_000_000_000, 1_000_000))  # a millisecond apart
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock))
    made = [ids.new_call_id() for _ in range(ids.BLOCK * 3)]
    assert made == sorted(made) and len(set(made)) == len(made)
    # the same millisecond: 80 random bits tell them apart, in no particular order
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    same = [ids.new_call_id() for _ in range(ids.BLOCK * 3)]
    assert len({c[17:] for c in same}) == len(same) and same != sorted(same)
