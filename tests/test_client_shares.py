"""Each client's fair share of the memory pool (issue 33, point 1): what the inputs hold
for one client (its partial frames) can never fill the pool, whatever that client does,
so another client's message never meets ``no_memory`` for it; and the pool's books stay
exact through every charge and release (a state machine drives them)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.books.shares import SHARE_FLOOR_BYTES

BUDGET = 16 * 1024 * 1024
READ = 32 * 1024


def read_size(pool: MemoryPool, client: object) -> int:
    """What a stream connection reads for ``client`` (its ``get_buffer``): a buffer, or
    what its share leaves, at least a byte."""
    return min(READ, max(1, pool.shares.room(client)))


def hold_until_paused(pool: MemoryPool, client: object, reads: int) -> int:
    """A client's connection charges one read at a time, as the inputs do, and stops at
    the first refusal (paused); how many reads were charged."""
    for done in range(reads):
        if not pool.shares.charge(client, read_size(pool, client)):
            return done + 1
    return reads


def test_one_client_alone_holds_at_most_half_the_pool() -> None:
    pool = MemoryPool(BUDGET)
    hold_until_paused(pool, "hostile", 10_000)
    # Paused at its share (half the pool: room kept for one more client), overshooting by
    # at most the read that found it there.
    assert pool.shares.held("hostile") <= BUDGET // 2 + 1
    assert pool.used == pool.shares.held("hostile")
    # Another client's messages find room: the pool is not depleted.
    assert pool.try_allocate(BUDGET // 2 - READ)


def test_the_share_is_the_pool_divided_between_the_holders_and_one_more() -> None:
    pool = MemoryPool(BUDGET)
    assert pool.shares.share() == BUDGET  # nobody holds anything: the next one gets half
    pool.shares.charge("a", 1)
    assert pool.shares.share() == BUDGET // 2
    pool.shares.charge("b", 1)
    assert pool.shares.share() == BUDGET // 3
    pool.shares.release("a", 1)
    assert pool.shares.share() == BUDGET // 2
    assert pool.shares.holders == 1
    tiny = MemoryPool(100 * 1024)
    tiny.shares.charge("a", 1)
    assert tiny.shares.share() == SHARE_FLOOR_BYTES  # never below the floor


def test_many_connections_of_one_client_share_its_one_share() -> None:
    # The probe of issue 33: 300 silent connections of one uid, each holding a 1 MiB
    # frame minus one byte, read one buffer at a time; they stop at the client's share.
    pool = MemoryPool(BUDGET)
    hostile = ("uid", 1000)
    paused = 0
    for _connection in range(300):
        for _read in range(32):
            if not pool.shares.charge(hostile, read_size(pool, hostile)):
                paused += 1
                break
    # Each connection past the share read one byte, and paused.
    assert paused == 300 - (BUDGET // 2) // (32 * READ)
    assert pool.shares.held(hostile) == BUDGET // 2 + paused
    # The normal sender (another uid) holds partial frames too: never paused.
    assert pool.shares.charge(("uid", 0), READ)
    assert not pool.is_depleted


def test_a_paused_client_is_told_when_it_is_under_its_share_again() -> None:
    pool = MemoryPool(BUDGET)
    hold_until_paused(pool, "a", 10_000)
    told: list[str] = []
    pool.shares.when_room("a", lambda: told.append("a"))
    assert told == []
    assert pool.shares.waiting == 1
    pool.shares.release("a", 2 * READ)  # one of its frames completed
    assert told == ["a"]
    assert pool.shares.waiting == 0


def test_a_client_leaving_grows_the_others_shares_and_wakes_them() -> None:
    pool = MemoryPool(BUDGET)
    pool.shares.charge("b", READ)
    hold_until_paused(pool, "a", 10_000)  # paused at a third of the pool
    assert pool.shares.held("a") == BUDGET // 3 + 1
    told: list[str] = []
    pool.shares.when_room("a", lambda: told.append("a"))
    pool.shares.release("b", READ)  # b holds nothing now: a's share is half the pool
    assert told == ["a"]


def test_a_withdrawn_waiter_is_never_told() -> None:
    pool = MemoryPool(BUDGET)
    hold_until_paused(pool, "a", 10_000)
    told: list[str] = []

    def callback() -> None:
        told.append("a")

    pool.shares.when_room("a", callback)
    pool.shares.cancel_when_room("a", callback)
    pool.shares.release("a", pool.shares.held("a"))
    assert told == []
    assert pool.used == 0


class SharesMachine(RuleBasedStateMachine):
    """Any sequence of charges and releases by any clients, of accepted messages held and
    let go, of budgets and floors changed: the pool's books equal the sum of what the
    clients' partial frames hold, a client that was under its share is never refused by
    its share (only by a pool that has no room), every room is the module's formula, and
    ``room_for_any`` (kept as the charges come and go) is never more than any room."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = MemoryPool(1024 * 1024)
        self.floor = SHARE_FLOOR_BYTES
        self.held: dict[int, int] = {}  # partial frames' bytes, charged to the pool too
        self.kept: dict[int, int] = {}  # accepted messages' (hold): the pool's elsewhere

    def holders(self) -> int:
        return len(set(self.held) | set(self.kept))

    @rule(client=st.integers(0, 4), nbytes=st.integers(1, 200_000))
    def charge(self, client: int, nbytes: int) -> None:
        shares = self.pool.shares
        before = shares.held(client)
        room = not self.pool.is_depleted
        holders_after = shares.holders + (0 if before else 1)
        share = max(self.floor, self.pool.budget // (holders_after + 1))
        granted = shares.charge(client, nbytes)
        assert granted == (before < share and room)
        self.held[client] = self.held.get(client, 0) + nbytes

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.held)))
        nbytes = data.draw(st.integers(1, self.held[client]))
        self.pool.shares.release(client, nbytes)
        self.held[client] -= nbytes
        if not self.held[client]:
            del self.held[client]

    @rule(client=st.integers(0, 4), nbytes=st.integers(1, 200_000))
    def hold(self, client: int, nbytes: int) -> None:
        self.pool.shares.hold(client, nbytes)
        self.kept[client] = self.kept.get(client, 0) + nbytes

    @precondition(lambda self: bool(self.kept))
    @rule(data=st.data())
    def let_go(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.kept)))
        nbytes = data.draw(st.integers(1, self.kept[client]))
        self.pool.shares.let_go(client, nbytes)
        self.kept[client] -= nbytes
        if not self.kept[client]:
            del self.kept[client]

    @rule(budget=st.integers(128 * 1024, 4 * 1024 * 1024))
    def resize(self, budget: int) -> None:
        self.pool.resize(budget)

    @rule(frame_bytes=st.integers(0, 600_000))
    def admit_frames_up_to(self, frame_bytes: int) -> None:
        self.pool.shares.admit_frames_up_to(frame_bytes)
        self.floor = max(SHARE_FLOOR_BYTES, frame_bytes)

    @invariant()
    def books_are_exact(self) -> None:
        assert self.pool.used == sum(self.held.values())
        assert self.pool.shares.holders == self.holders()
        for client in set(self.held) | set(self.kept):
            assert self.pool.shares.held(client) == self.held.get(client, 0) + self.kept.get(
                client, 0
            )

    @invariant()
    def rooms_are_the_formula(self) -> None:
        shares, budget, holders = self.pool.shares, self.pool.budget, self.holders()
        assert shares.share() == max(self.floor, budget // (holders + 1))
        for client in range(6):  # 5: never a holder
            held = shares.held(client)
            others = holders + (0 if held else 1)
            room = shares.room(client)
            assert room == max(self.floor, budget // (others + 1)) - held
            assert shares.room_for_any <= room


TestShares = SharesMachine.TestCase


def test_a_frame_of_the_largest_size_the_inputs_accept_always_fits_a_share() -> None:
    """A Dory config may allow a stream frame larger than half the pool: the share's floor
    is one such frame, so it can complete (it was closed at once before)."""
    pool = MemoryPool(4 * 1024 * 1024)
    shares = pool.shares
    frame = 3 * 1024 * 1024
    shares.charge("another client", 1)
    assert shares.largest_share() < frame
    assert shares.room("a client") < frame
    shares.admit_frames_up_to(frame)
    assert shares.largest_share() >= frame
    assert shares.room("a client") >= frame
