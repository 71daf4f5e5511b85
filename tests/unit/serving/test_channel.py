"""The job-helper channel (serving/channel.py): framed messages both ways, large bodies, EOF when the
other end is gone, and the first message waited for with a bound."""

from __future__ import annotations

import select
import socket
import threading

from memexporter.serving.channel import Channel


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
