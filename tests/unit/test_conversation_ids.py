"""`ConversationIds`: each id made ahead, once the last request is out, and never handed out
twice (by two threads, or by a parent and its forked child)."""

from __future__ import annotations

import os
import re
import threading

from pytest_mock import MockerFixture

import app.conversation_ids as conversation_ids
from app.conversation_ids import ConversationIds

HEX_ID = re.compile(r"[0-9a-f]{32}")


def test_with_none_made_ahead_each_take_is_a_fresh_id() -> None:
    ids = ConversationIds()
    taken = [ids.take() for _ in range(3)]
    assert all(HEX_ID.fullmatch(t) for t in taken)
    assert len(set(taken)) == 3


def test_take_hands_out_the_id_refill_made_without_making_another(mocker: MockerFixture) -> None:
    ids = ConversationIds()
    ids.refill()
    ids.refill()  # one waits already: none more
    made = mocker.spy(conversation_ids, "new_conversation_id")

    first = ids.take()
    second = ids.take()

    assert made.call_count == 1, "the second take made its own: only one was made ahead"
    assert made.spy_return == second
    assert first != second and HEX_ID.fullmatch(first)


def test_an_id_made_in_another_process_is_never_taken(mocker: MockerFixture) -> None:
    ids = ConversationIds()
    ids.refill()
    parent = ids._ready[0][1]
    mocker.patch.object(conversation_ids.os, "getpid", return_value=os.getpid() + 1)  # as in a forked child

    assert ids.take() != parent
    assert ids._ready == []


def test_threads_taking_and_refilling_at_once_never_share_an_id() -> None:
    ids = ConversationIds()
    taken: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def run(mine: list[str]) -> None:
        start.wait()
        for _ in range(300):
            mine.append(ids.take())
            ids.refill()

    threads = [threading.Thread(target=run, args=(mine,)) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [t for mine in taken for t in mine]
    assert len(every) == 2400
    assert len(set(every)) == 2400
