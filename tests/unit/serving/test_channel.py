"""The job-helper channel (serving/channel.py): framed messages both ways, large bodies, EOF when the
other end is gone, and the first message waited for with a bound."""

from __future__ import annotations

import select
import socket
import threading
import time

from memexporter.serving.channel import OUTBOX_MAX, Channel


def receive_all(channel: Channel, count: int) -> list[tuple[dict[str, object], bytes]]:
    out: list[tuple[dict[str, object], bytes]] = []
    while len(out) < count:
        select.select([channel.sock], [], [], 10)
        got = channel.receive()
        assert got is not None
        out += got
    return out


def test_messages_arrive_whole_and_in_order_whatever_their_size() -> None:
    a, b = (Channel(s) for s in socket.socketpair())
    body = bytes(range(256)) * 20000  # 5 MB: many reads
    sender = threading.Thread(
        target=lambda: [a.send({"t": "x", "n": 1}), a.send({"t": "y"}, body), a.send({"t": "z", "n": 3})]
    )
    sender.start()
    got = receive_all(b, 3)
    sender.join()
    assert got == [({"t": "x", "n": 1}, b""), ({"t": "y"}, body), ({"t": "z", "n": 3}, b"")]
    a.close()
    b.close()


def test_eof_when_the_other_end_is_gone_and_sends_say_false() -> None:
    a, b = (Channel(s) for s in socket.socketpair())
    a.close()
    assert b.receive() is None
    assert not a.send({"t": "late"})
    b.close()


def test_the_first_message_is_waited_for_within_a_bound() -> None:
    a, b = (Channel(s) for s in socket.socketpair())
    assert b.receive_one(0.05) is None  # nothing came
    a.send({"t": "config", "port": 9400})
    a.send({"t": "answer"})
    assert b.receive_one(5) == ({"t": "config", "port": 9400}, b"")
    assert b.receive_one(5) == ({"t": "answer"}, b"")  # a message that came with it is kept
    a.close()
    b.close()


def test_post_never_blocks_on_a_peer_that_does_not_read_and_queues_a_bounded_amount() -> None:
    """A stopped helper: its socket's buffer fills, and the job's sends must still return at once."""
    a, b = (Channel(s) for s in socket.socketpair())
    body = b"y" * (1 << 20)
    t0 = time.monotonic()
    posted = [a.post({"t": "answer", "n": n}, body) for n in range(80)]  # 80 MiB against a 64 MiB bound
    took = time.monotonic() - t0
    assert took < 2.0, f"80 posts took {took:.2f} s"
    assert posted[:60] == [True] * 60 and not all(posted), "nothing was dropped past OUTBOX_MAX"
    assert 0 < a.pending <= OUTBOX_MAX
    kept = posted.count(True)
    got: list[tuple[dict[str, object], bytes]] = []
    while len(got) < kept:  # the peer reads again: every queued message arrives whole, in order
        a.pump()
        select.select([b.sock], [], [], 5)
        got += b.receive() or []
    assert [head["n"] for head, _ in got] == list(range(kept)) and all(body == got_body for _, got_body in got)
    assert a.pending == 0
    a.close()
    b.close()


def test_an_empty_queue_takes_one_message_larger_than_the_bound() -> None:
    """An allocator snapshot for /debug/snapshot can pass OUTBOX_MAX: alone, it still goes."""
    a, b = (Channel(s) for s in socket.socketpair())
    big = b"s" * (OUTBOX_MAX + (1 << 20))
    assert a.post({"t": "answer"}, big) and not a.post({"t": "answer"}, b"more")
    got: list[tuple[dict[str, object], bytes]] = []
    while not got:
        a.pump()
        select.select([b.sock], [], [], 5)
        got += b.receive() or []
    assert got == [({"t": "answer"}, big)]
    a.close()
    b.close()


def test_post_to_a_peer_that_is_gone_drops_the_queue() -> None:
    a, b = (Channel(s) for s in socket.socketpair())
    a.post({"t": "x"}, b"z" * (4 << 20))
    b.close()
    a.pump()
    assert a.pending == 0
    a.close()
    assert not a.post({"t": "late"})
