"""Where a pooled model's requests go (runner/engine/pools.py), without a server: a prompt-cache group sticks to one
endpoint, groups spread by their digest, a request of no group goes where there is most room, a group leaves an
endpoint with a line for an idle one, and failures take an endpoint out (never the last)."""

from __future__ import annotations

from runner.engine.limits import Endpoint
from runner.engine.pools import STREAK, Member, PoolRoute
from runner.errors import AuthError, BadRequest, TransientError


def route(count: int = 3, slots: int = 4) -> tuple[PoolRoute, list[str]]:
    notes: list[str] = []
    members = []
    for n in range(count):
        endpoint = Endpoint(f"e{n}", clock=lambda: 0.0)
        endpoint.slots.resize(slots)
        members.append(Member(f"sim:{n}", f"sim:{n}", "m", endpoint))
    return PoolRoute("sim:m", members, notes), notes


def test_a_group_sticks_to_one_endpoint_and_groups_spread_over_all() -> None:
    pool, _ = route()
    chosen = {group: pool.choose(group) for group in (f"g{n}" for n in range(60))}
    assert all(pool.choose(group) is member for group, member in chosen.items())
    assert {m.label for m in chosen.values()} == {"sim:0", "sim:1", "sim:2"}


def test_a_request_of_no_group_goes_where_there_is_most_room() -> None:
    pool, _ = route()
    pool.members[0].endpoint.slots.held = 4
    pool.members[1].endpoint.slots.held = 1
    assert pool.choose(None).label == "sim:2"
    pool.members[2].endpoint.slots.held = 3
    assert pool.choose(None).label == "sim:1"


def test_a_new_group_goes_to_an_idle_endpoint_rather_than_one_with_a_line_and_a_placed_one_stays() -> None:
    pool, _ = route()
    placed = pool.choose("g")
    hashed = route()[0].choose("h")
    for member in pool.members:
        if member.label in (placed.label, hashed.label):
            member.endpoint.slots.held = 4
            member.endpoint.slots.waiters.append(object())  # type: ignore[arg-type]
    assert pool.choose("g") is placed, "its prefix is cached there"
    new = pool.choose("h")
    assert new.label != hashed.label and not new.endpoint.slots.waiters and pool.choose("h") is new


def test_a_streak_of_failures_or_a_refused_key_takes_an_endpoint_out_but_never_the_last() -> None:
    pool, notes = route()
    down = TransientError("connection refused", error_class="connection")
    for _ in range(STREAK - 1):
        pool.failed(pool.members[0], down)
    pool.failed(pool.members[0], BadRequest("no"))  # not a sign it is down: the streak starts again
    for _ in range(STREAK - 1):
        pool.failed(pool.members[0], down)
    assert pool.members[0].out is None
    pool.failed(pool.members[0], down)
    assert pool.members[0].out is not None and len(notes) == 1
    assert notes[0] == ("endpoint sim:0 of sim:m is taken out after 5 failures in a row (connection: connection "
                        "refused): its work goes to sim:1, sim:2")
    pool.failed(pool.members[1], AuthError("invalid key"))
    assert pool.members[1].out is not None and {pool.choose(f"g{n}").label for n in range(20)} == {"sim:2"}
    pool.failed(pool.members[2], AuthError("invalid key"))
    assert pool.members[2].out is None and len(notes) == 2, "the last endpoint keeps serving"
