"""Targeted sequences of the split core around hedged batches (copies of a
quiet lane's batch), the write cut-off and failures (see
test_core_split_fuzz for random ones)."""

from subwabbit.core.channel import Channel
from subwabbit.core.split import SplitPredictExchange

from test_core import NumberFormatter, parse

LINE = len(b"|c |x 0\n")


def _exchange(items, **kwargs):
    settings = dict(formatter=NumberFormatter(), common_part="|c", common_features=None,
                    items=items, debug_info=None, parse=parse, batch_size=10,
                    max_in_flight_lines=10, deadline=1.0, write_cutoff_s=0.5)
    settings.update(kwargs)
    return SplitPredictExchange(**settings)


def _hedged():
    """Items 0-9 on lane a, which answers 0-2 and goes quiet; a copy of 3-9 goes to b."""
    exchange = _exchange(range(10))
    a, b = exchange.add_lane("a", Channel()), exchange.add_lane("b", Channel())
    assert exchange.step(0.0) == []
    assert [s.batch.start for s in a.shares] == [0] and not b.shares
    a.channel.write_with(len)
    a.channel.receive(b"0\n1\n2\n")
    got = exchange.step(0.001)
    now = 0.001
    while not exchange.hedged_lines and now < 0.4:
        now += 0.001
        got += exchange.step(now)
    assert got == [0, 1, 2] and exchange.hedged_lines == 7
    assert [(s.next, s.end) for s in b.shares] == [(3, 10)]
    return exchange, a, b, now


def test_a_hedged_batch_answered_by_both_lanes_gives_each_item_once():
    exchange, a, b, now = _hedged()
    b.channel.write_with(len)
    b.channel.receive(b"3\n4\n5\n")
    a.channel.receive(b"3\n4\n5\n6\n")  # a wakes up: 3-5 are dropped, 6 is new
    got = exchange.step(now + 0.0001)
    b.channel.receive(b"6\n7\n8\n9\n")
    got += exchange.step(now + 0.0002)
    assert got == [3, 4, 5, 6, 7, 8, 9] and exchange.done
    exchange.end()
    assert a.channel.stale_lines == 3  # a's 7-9 are discarded as they arrive


def test_cutoff_with_a_copy_cut_mid_line_then_the_original_lane_fails():
    exchange, a, b, now = _hedged()
    b.channel.write_with(lambda view: 4 * LINE + 2)  # b took 3-6 and part of 7
    assert exchange.step(0.6) == []  # the cut-off: b's line 7 is completed, 8-9 dropped
    assert [(s.next, s.end) for s in b.shares] == [(3, 8)]
    assert [(s.next, s.end) for s in a.shares] == [(3, 10)]
    exchange.fail_lane(a)  # what b reached is all the call can still return
    assert exchange._limit == 8
    b.channel.write_with(len)
    b.channel.receive(b"3\n4\n5\n6\n7\n")
    assert exchange.step(0.61) == [3, 4, 5, 6, 7]
    assert exchange.done and not exchange.timed_out


def test_cutoff_drops_an_unwritten_copy_and_the_results_end_where_the_original_reached():
    exchange, a, b, now = _hedged()
    assert exchange.step(0.6) == []  # b took nothing of its copy
    assert not b.shares and b.drained
    a.channel.receive(b"3\n4\n")
    assert exchange.step(0.61) == [3, 4]
    exchange.fail_lane(a)
    assert exchange.step(0.62) == []
    assert exchange.done and not exchange.timed_out


def test_a_lane_added_with_stale_lines_gives_them_to_no_one():
    channel = Channel()
    first = _exchange(range(100, 110), deadline=None)
    first.add_lane("x", channel)
    first.step(0.0)
    channel.write_with(len)
    channel.receive(b"100\n10")  # an answer split mid-line
    assert first.step(0.0) == [100]
    first.end()
    second = _exchange(range(5), deadline=None, max_in_flight_lines=20)
    second.add_lane("x", channel)
    second.step(0.0)
    channel.write_with(len)
    channel.receive(b"1\n102\n103\n104\n105\n106\n107\n108\n109\n0\n1\n2\n3\n4\n")
    assert second.step(0.0) == [0, 1, 2, 3, 4] and second.done
    assert channel.in_flight_lines == 0 and channel.stale_lines == 0


def _quiet_after(answered_before_stopping):
    """Items 0-9 on lane a, which answers some of them and stops; lane b,
    a fresh engine (no pace known), is empty with room for a copy. The
    driver waits until wake_at() each time; a's pipes never move again."""
    exchange = _exchange(range(10), deadline=None, write_cutoff_s=0.0)
    a, b = exchange.add_lane("a", Channel()), exchange.add_lane("b", Channel())
    exchange.step(0.0)
    assert [share.batch.start for share in a.shares] == [0] and not b.shares
    a.channel.write_with(len)
    a.channel.receive(b"".join(b"%d\n" % n for n in range(answered_before_stopping)))
    now = 0.001
    exchange.step(now)
    while not exchange.hedged_lines and now < 10.0:
        wake = exchange.wake_at()
        assert wake is not None
        now = max(wake, now + 1e-4)
        exchange.step(now)
    return exchange, now


def test_a_stopped_engine_is_copied_whatever_it_answered_before_stopping():
    # Answering nothing before stopping: the copy comes after HEDGE_UNKNOWN_S.
    exchange, now = _quiet_after(0)
    assert exchange.hedged_lines == 10 and now < 0.01
    # Answering a quarter batch or more first made its pace the only one
    # known, and that pace fell the longer it was silent: the wait for its
    # copy grew faster than the silence, and without a deadline the call
    # waited for io_timeout_s (or forever) while b sat idle.
    exchange, now = _quiet_after(3)
    assert exchange.hedged_lines == 7 and now < 0.1, (exchange.hedged_lines, now)
