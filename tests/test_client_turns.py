"""Fair service between clients (issue 33, point 2), checked by the order of turns, not by
timing: the loop's read turns go round the busy *clients* (a uid on every transport), then
round each client's connections, with one budget for every stream input on the loop. So
a paced client beside any number of flooders of other clients, each with any number of
connections, on any stream input, is read within one round of the busy clients of its
data arriving; before, turns went round the connections of each input apart, and a client
with a hundred connections took a hundred turns for another's one.

(The datagram input is read in every turn its socket is readable, for at most
``DATAGRAM_BURST`` datagrams, so what a datagram sender waits for between two reads is one
turn's stream budget, whatever the number of stream flooders and stream inputs:
BENCHMARKS.md, "Fair service between clients", has the rates measured with the flooders in
processes of their own.)
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import pytest

from pydory.daemon.inputs.turns import CONNECTIONS_PER_TURN, ReadTurns, loop_turns


@dataclass(eq=False)
class Busy:
    """A connection that always has more to read: after its turn it fills its buffer
    again and waits for the next (as ``StreamInputProtocol.buffer_updated`` does)."""

    client: str
    turns: int = 0

    def pause(self) -> None:
        pass

    def take_turn(self) -> None:
        self.turns += 1


def run_turns(turns: ReadTurns, count: int) -> list[str]:
    """``count`` turns of the loop; which client read in each."""
    order: list[str] = []
    for _ in range(count):
        for connection in turns.next_turn():
            assert isinstance(connection, Busy)
            connection.take_turn()
            order.append(connection.client)
            turns.wait_for_turn(connection, connection.client)  # busy again
    return order


async def queue(turns: ReadTurns, connections: list[Busy]) -> None:
    for connection in connections:
        turns.wait_for_turn(connection, connection.client)


@pytest.mark.parametrize("flooders", [1, 4, 16])
@pytest.mark.parametrize("connections_each", [1, 100])
def test_a_busy_client_reads_once_a_round_beside_any_number_of_flooders(
    flooders: int, connections_each: int
) -> None:
    turns = ReadTurns()
    flood = [Busy(f"flooder{i}") for i in range(flooders) for _ in range(connections_each)]
    paced = Busy("paced")

    async def scenario() -> list[str]:
        await queue(turns, flood)  # the flooders' connections were busy first
        await queue(turns, [paced])
        order = run_turns(turns, (flooders + 1) * 20)
        turns.withdraw([*flood, paced])
        return order

    order = asyncio.run(scenario())
    rounds = flooders + 1
    # One read per turn for all the stream inputs together.
    assert CONNECTIONS_PER_TURN == 1
    # The paced client is read within one round of the busy clients, every round, whatever
    # the number of connections its neighbours hold (before: once in flooders x
    # connections_each + 1 turns).
    positions = [i for i, client in enumerate(order) if client == "paced"]
    assert positions[0] <= rounds - 1
    assert all(b - a == rounds for a, b in itertools.pairwise(positions))
    assert len(positions) == 20
    # And the flooders share the rest equally, whatever their connections.
    for i in range(flooders):
        assert order.count(f"flooder{i}") == 20


def test_a_clients_connections_take_its_turns_in_order() -> None:
    turns = ReadTurns()
    mine = [Busy("me") for _ in range(3)]

    async def scenario() -> None:
        await queue(turns, mine)
        run_turns(turns, 9)
        turns.withdraw(mine)

    asyncio.run(scenario())
    assert [c.turns for c in mine] == [3, 3, 3]


def test_every_stream_input_on_a_loop_shares_one_budget() -> None:
    async def two_inputs() -> tuple[ReadTurns, ReadTurns]:
        return loop_turns(), loop_turns()  # what a UNIX stream and a TCP input each take

    tcp_turns, unix_turns = asyncio.run(two_inputs())
    assert tcp_turns is unix_turns
    assert asyncio.run(two_inputs())[0] is not tcp_turns  # another loop, its own


def test_an_input_closing_withdraws_its_connections_only() -> None:
    turns = ReadTurns()
    closing, staying = [Busy("a"), Busy("b")], [Busy("a"), Busy("c")]

    async def scenario() -> list[str]:
        await queue(turns, [closing[0], staying[0], closing[1], staying[1]])
        turns.withdraw(closing)
        assert turns.waiting == 2
        order = [c.client for c in turns.next_turn() + turns.next_turn()]
        turns.withdraw(staying)
        return order

    assert asyncio.run(scenario()) == ["a", "c"]
    assert turns.waiting == 0
