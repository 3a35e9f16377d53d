"""The worker's claim planner, driven through scripted rounds: which claim statements each
round runs, in which order. The statements are stood in for by a script of what the queues
hold (the decisions are pure; the statements themselves are tested on PostgreSQL in
tests/integration/test_flow_limits.py).

A round is written as the letters of the statements it ran: K job_claim, O
job_claim_keyed_open, S job_claim_keyed_slots, F job_claim_keyed. The sequences were taken
from the planner as it was on the queue before it moved to the worker, and pin it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import cast

import pytest

from leaseq.core.claims import Claims
from leaseq.core.models import ClaimedJob, OpenClaim, SlotsClaim
from leaseq.runtime.claims import ClaimPlanner, KeyedBy, keyed_first, keyed_instead, keyed_start

NONE, LIMITED, RATED = "none", "limited", "rated"


@dataclass
class World:
    """What the queues hold in a round: ready keyless and keyed jobs, and the keyed queues'
    flow control (none, a limit, or a rate)."""

    keyless: int = 0
    keyed: int = 0
    flow: str = NONE


class Script:
    """The four claim statements answering from a World, as PostgreSQL would: each leases
    what there is up to its limit, and the open and slots claims lease nothing from queues
    whose flow control they do not keep, and say so."""

    def __init__(self) -> None:
        self.world = World()
        self.ran = ""

    def _take(self, letter: str, available: int, limit: int) -> list[ClaimedJob]:
        self.ran += letter
        return cast(list[ClaimedJob], [object()] * min(available, limit))

    def keyless(self, limit: int) -> list[ClaimedJob]:
        return self._take("K", self.world.keyless, limit)

    def keyed_open(self, limit: int) -> OpenClaim:
        if self.world.flow != NONE:
            return OpenClaim(self._take("O", 0, limit), True, self.world.flow == RATED)
        return OpenClaim(self._take("O", self.world.keyed, limit), False, False)

    def keyed_slots(self, limit: int) -> SlotsClaim:
        if self.world.flow == RATED:
            return SlotsClaim(self._take("S", 0, limit), True)
        return SlotsClaim(self._take("S", self.world.keyed, limit), False)

    def keyed(self, limit: int) -> list[ClaimedJob]:
        return self._take("F", self.world.keyed, limit)


def rounds(worlds: list[tuple[int, World]], planner: ClaimPlanner | None = None) -> str:
    """The statements of each round (limit, world), rounds separated by spaces."""
    planner = planner or ClaimPlanner()
    script = Script()
    ran = []
    for limit, world in worlds:
        script.world, script.ran = world, ""
        got = planner(cast(Claims, script), limit)
        assert len(got) <= limit
        ran.append(script.ran)
    return " ".join(ran)


def test_keyless_work_pays_one_statement_and_probes_keyed_every_16th_round() -> None:
    seen = rounds([(1, World(keyless=5))] * 33)
    assert seen.split()[15] == "OK" and seen.split()[31] == "OK"
    assert seen == " ".join(["K"] * 15 + ["OK"] + ["K"] * 15 + ["OK", "K"])


def test_keyed_work_pays_one_statement_and_probes_keyless_every_16th_round() -> None:
    # Round 1 looks for keyless work first: a new planner believes in it.
    seen = rounds([(1, World(keyed=5))] * 33)
    assert seen == " ".join(["KO"] + ["O"] * 14 + ["KO"] + ["O"] * 15 + ["KO", "O"])


def test_both_kinds_alternate_going_first_once_both_were_found() -> None:
    # Keyed work is first looked for by the probe of round 16.
    seen = rounds([(1, World(keyless=5, keyed=5))] * 20)
    assert seen == " ".join(["K"] * 15 + ["O", "K", "O", "K", "O"])


def test_a_short_batch_is_filled_from_the_other_kind() -> None:
    assert rounds([(4, World(keyless=2, keyed=2))] * 4) == "KO OK KO OK"
    # A full batch from the kind that went first: the other waits for its turn.
    assert rounds([(4, World(keyless=1, keyed=9))] * 3) == "KO O KO"


def test_keyed_claims_take_the_cheapest_statement_that_keeps_the_limits() -> None:
    """A limit found by the open claim sends the planner to the slots claim, a rate to the
    full one; it stays there until every 64th round asks the open claim again."""
    planner = ClaimPlanner()
    assert rounds([(1, World(keyed=5, flow=LIMITED))] * 3, planner) == "KOS S S"
    assert rounds([(1, World(keyed=5, flow=RATED))] * 2, planner) == "SF F"
    # Rounds 6 to 63 by the full claim, though the rate is gone (one round in 16 probes
    # keyless work first); round 64 asks the open claim again, and it stays.
    seen = rounds([(1, World(keyed=5))] * 60, planner).split()
    assert set(seen[:58]) == {"F", "KF"}
    assert seen[58:] == ["KO", "O"]


def test_a_mixed_script_runs_the_pinned_sequence() -> None:
    """300 rounds of random work and batch sizes, flow control changed every 37 rounds, one
    kind of work gone for rounds 101-159 and 201-259: the statements of every round, as the
    planner on the queue ran them. Rows of 16 rounds: the probes are the last column."""
    rnd = random.Random(7)
    flows = [LIMITED, RATED, NONE, RATED, LIMITED, NONE, LIMITED, NONE]
    worlds = []
    for r in range(1, 301):
        keyless = rnd.choice([0, 0, 1, 3, 10])
        keyed = rnd.choice([0, 0, 2, 10])
        keyed = 0 if 100 < r < 160 else keyed
        keyless = 0 if 200 < r < 260 else keyless
        flow = NONE if r < 37 else flows[(r // 37) % 8]
        worlds.append((rnd.choice([1, 1, 4, 10]), World(keyless, keyed, flow)))
    seen = rounds(worlds).split()
    assert [" ".join(seen[i : i + 16]) for i in range(0, 300, 16)] == PINNED


PINNED = [
    "KO KO K KO K KO OK K KO K K K KO KO K O",
    "KO OK KO K K KO OK K K KO KO K KO O K OK",
    "KO KO K KO OF FK K FK KF KF F F F FK K F",
    "K FK K K KF K KF FK K F K FK K K K OFK",
    "KF F F FK K K KF K K K KF KF KF F F KF",
    "KF K KF KF KF FK KF K KF FK K KF F FK K FK",
    "K K K KF FK KF K K K KF KF K K K KF FK",
    "KF KF KF KF KF KF KF K KF KF KF KF KF KF KF OFK",
    "KF K KF KF K K KF KF KF KF KF KF K KF KF FK",
    "KF KF KF KF KF K KF KF KF KF KF KF KF KF K FK",
    "K KF KF FK K KF K K K KF KF F FK KF KF F",
    "FK KF FK K KF K KF F F FK K FK KF F F K",
    "KF K KF FK K KF KF F KF FK KF FK KF F F KF",
    "F FK F F FK KF FK KF KF FK FK FK F FK KF KF",
    "FK KF KF KF FK KF FK KF FK FK KF KF FK KF F KF",
    "FK KF KF KF KF KF KF FK KF KF KF F FK KF FK OS",
    "SK KS KS S S S SK KS KS K K K KS K KS S",
    "SK K K KS K SK KS K KS SK KS K KS S KS S",
    "KS SK S SK K SK KS S KS S SK KS",
]


@pytest.mark.parametrize(
    ("round_", "keyed_seen", "keyless_seen", "expected"),
    [
        (1, False, True, False),
        (16, False, True, True),
        (1, True, False, True),
        (16, True, False, False),
        (3, True, True, False),
        (4, True, True, True),
        (15, False, False, False),
        (16, False, False, True),
    ],
)
def test_which_kind_goes_first(
    round_: int, keyed_seen: bool, keyless_seen: bool, expected: bool
) -> None:
    assert keyed_first(round_, keyed_seen, keyless_seen) is expected


def test_the_keyed_statement_to_start_with_and_to_go_on_with() -> None:
    assert keyed_start(63, KeyedBy.FULL) is KeyedBy.FULL
    assert keyed_start(64, KeyedBy.FULL) is KeyedBy.OPEN
    assert keyed_instead(KeyedBy.OPEN, limited=False, rated=False) is None
    assert keyed_instead(KeyedBy.OPEN, limited=True, rated=False) is KeyedBy.SLOTS
    assert keyed_instead(KeyedBy.OPEN, limited=True, rated=True) is KeyedBy.FULL
    assert keyed_instead(KeyedBy.SLOTS, limited=True, rated=False) is None
    assert keyed_instead(KeyedBy.SLOTS, limited=True, rated=True) is KeyedBy.FULL
    assert keyed_instead(KeyedBy.FULL, limited=True, rated=True) is None
