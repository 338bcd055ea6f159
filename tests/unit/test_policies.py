"""Slot-allocation policies: property-based invariants for every policy, then each policy's documented behaviour."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.policies import (
    POLICIES,
    AllocationPolicy,
    JobDemand,
    SizedPolicy,
    SlotRange,
    make_policy,
    register_policy,
    validate_allocation,
)

ALL = sorted(POLICIES)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- strategies ------------------------------------------------------------------------------------


@st.composite
def demands(draw, job_id: int, min_one: bool = False) -> JobDemand:
    requested = draw(st.integers(1, 40))
    min_slots = 1 if min_one else draw(st.integers(1, requested))
    return JobDemand(
        job_id=job_id,
        requested_slots=requested,
        priority=draw(st.integers(0, 3)),
        weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.5])),
        min_slots=min_slots,
    )


@st.composite
def scenarios(draw, min_one: bool = False):
    """A pool size and a sequence of arrivals (a JobDemand) and departures (an index into the live jobs)."""
    pool = draw(st.integers(0, 100))
    steps = []
    next_id = 0
    live = 0
    for _ in range(draw(st.integers(1, 14))):
        if live and draw(st.integers(0, 2)) == 0:
            steps.append(("leave", draw(st.integers(0, live - 1))))
            live -= 1
        else:
            steps.append(("arrive", draw(demands(next_id, min_one))))
            next_id += 1
            live += 1
    return pool, steps


def replay(policy: AllocationPolicy, pool: int, steps):
    """Yield (event, jobs before, allocation before, jobs after, allocation after) for every step."""
    jobs: list[JobDemand] = []
    alloc: dict[int, SlotRange | None] = {}
    for kind, arg in steps:
        before_jobs, before = list(jobs), dict(alloc)
        if kind == "arrive":
            jobs.append(arg)
        else:
            jobs.pop(arg)
        current = {k: v for k, v in alloc.items() if v is not None}
        alloc = policy.allocate(pool, jobs, current)
        yield (kind, arg), before_jobs, before, list(jobs), alloc


def sizes(alloc) -> dict[int, int]:
    return {k: (v.size if v is not None else 0) for k, v in alloc.items()}


def fits_in_a_gap(pool: int, alloc, size: int) -> bool:
    """Whether `size` slots fit in one free gap of `alloc` (else a newcomer forces compaction)."""
    if size == 0:
        return True
    held = [r for r in alloc.values() if r is not None]
    return any(all(r.end <= b or r.base >= b + size for r in held) for b in range(pool - size + 1))


# --- invariants every policy must keep ---------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(scenario=scenarios())
def test_invariants_hold_at_every_step(name, scenario):
    policy = make_policy(name)
    pool, steps = scenario
    for _, _, _, jobs, alloc in replay(policy, pool, steps):
        # Legal: every job answered, within the pool, no overlap, <= requested, >= min_slots or None.
        validate_allocation(pool, jobs, alloc)
        assert list(alloc) == [j.job_id for j in jobs]
        current = {k: v for k, v in alloc.items() if v is not None}
        # Deterministic: the same question gets the same answer, from a fresh instance too.
        assert make_policy(name).allocate(pool, jobs, current) == alloc
        # Stable: asking again with the answer as the current state changes nothing, object for object.
        again = policy.allocate(pool, jobs, current)
        assert all(again[k] is alloc[k] for k in alloc)


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(
    pool=st.integers(0, 60),
    jobs=st.lists(st.integers(1, 30), min_size=0, max_size=8),
    junk=st.lists(st.tuples(st.integers(-2, 9), st.integers(0, 70), st.integers(1, 40)), max_size=10),
)
def test_arbitrary_current_state_is_tolerated(name, pool, jobs, junk):
    """Departed jobs, ranges beyond the pool and overlapping ranges in `current` never leak into the answer."""
    demand = [JobDemand(i, r) for i, r in enumerate(jobs)]
    current = {job_id: SlotRange(base, size) for job_id, base, size in junk}
    alloc = make_policy(name).allocate(pool, demand, current)
    validate_allocation(pool, demand, alloc)


@pytest.mark.parametrize("name", ALL)
def test_unchanged_range_is_the_identical_object(name):
    policy = make_policy(name)
    jobs = [JobDemand(1, 10), JobDemand(2, 10)]
    first = policy.allocate(100, jobs, {})
    second = policy.allocate(100, jobs, {k: SlotRange(v.base, v.size) for k, v in first.items()})
    assert second == first
    held = {k: v for k, v in first.items()}
    third = policy.allocate(100, jobs, held)
    assert third[1] is held[1] and third[2] is held[2]


# --- policy-specific properties ------------------------------------------------------------------------


@SETTINGS
@given(scenario=scenarios())
def test_first_fit_never_takes_slots_away(scenario):
    pool, steps = scenario
    for (kind, arg), _, before, jobs, alloc in replay(make_policy("first-fit"), pool, steps):
        for job in jobs:
            old = before.get(job.job_id)
            if old is not None:
                assert alloc[job.job_id] is not None and alloc[job.job_id].size >= old.size
        # A newcomer whose whole request fits in an existing gap disturbs nobody.
        if kind == "arrive" and fits_in_a_gap(pool, before, arg.requested_slots):
            assert all(alloc[k] is v for k, v in before.items())
            assert alloc[arg.job_id] is not None and alloc[arg.job_id].size == arg.requested_slots


@SETTINGS
@given(scenario=scenarios())
def test_priority_serves_in_priority_order(scenario):
    pool, steps = scenario
    for (kind, arg), before_jobs, before, jobs, alloc in replay(make_policy("priority"), pool, steps):
        ranked = sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, i))
        above = 0
        for i in ranked:
            job = jobs[i]
            got = sizes(alloc)[job.job_id]
            if got < job.requested_slots:
                # It was short only because the jobs ranked above it left too little.
                assert pool - above < job.requested_slots
                if got == 0:
                    assert pool - above < job.min_slots
            above += got
        if (
            kind == "arrive"
            and all(arg.priority < j.priority for j in before_jobs)
            and fits_in_a_gap(pool, before, sizes(alloc)[arg.job_id])
        ):
            # A newcomer ranked below everyone disturbs nobody (unless it needs compaction to fit).
            assert all(alloc[k] is v for k, v in before.items())


@SETTINGS
@given(scenario=scenarios(min_one=True))
def test_weighted_is_work_conserving_and_proportional(scenario):
    pool, steps = scenario
    for (kind, arg), before_jobs, before, jobs, alloc in replay(make_policy("weighted"), pool, steps):
        got = sizes(alloc)
        assert sum(got.values()) == min(pool, sum(j.requested_slots for j in jobs))
        for short in jobs:
            if got[short.job_id] >= short.requested_slots:
                continue
            for other in jobs:  # nobody is above the short job's level by a whole slot per unit weight
                assert got[other.job_id] / other.weight - got[short.job_id] / short.weight < (
                    1 / other.weight + 1 / short.weight
                )
        served_in_full = all(sum(j.requested_slots for j in js) <= pool for js in (jobs, before_jobs))
        if served_in_full and (
            kind == "leave" or fits_in_a_gap(pool, before, arg.requested_slots)
        ):
            # Everyone is served in full: nobody moves unless a newcomer needs compaction to fit.
            assert all(alloc[k] is v for k, v in before.items() if k in alloc)


@SETTINGS
@given(scenario=scenarios())
def test_equal_gives_the_static_share(scenario):
    pool, steps = scenario
    for (kind, arg), before_jobs, before, jobs, alloc in replay(make_policy("equal"), pool, steps):
        share = pool // len(jobs) if jobs else 0
        for job in jobs:
            want = min(job.requested_slots, share)
            assert sizes(alloc)[job.job_id] == (want if want >= job.min_slots else 0)
        in_share = all(j.requested_slots <= pool // max(1, len(js)) for js in (jobs, before_jobs) for j in js)
        if in_share and (
            kind == "leave" or fits_in_a_gap(pool, before, arg.requested_slots)
        ):
            # Every job is within its share: nobody moves unless a newcomer needs compaction to fit.
            assert all(alloc[k] is v for k, v in before.items() if k in alloc)


# --- documented behaviour, by example ----------------------------------------------------------------


def test_priority_preemption_shrinks_the_low_priority_job_in_place():
    policy = make_policy("priority")
    low = JobDemand(1, 80, priority=0, min_slots=10)
    high = JobDemand(2, 60, priority=5)
    a = policy.allocate(100, [low], {})
    assert a == {1: SlotRange(0, 80)}
    b = policy.allocate(100, [low, high], a)
    assert b == {1: SlotRange(0, 40), 2: SlotRange(40, 60)}
    # When the high-priority job leaves, the low one grows back in place.
    c = policy.allocate(100, [low], {1: b[1]})
    assert c == {1: SlotRange(0, 80)}


def test_priority_preemption_drops_below_min_slots_to_ring():
    policy = make_policy("priority")
    low = JobDemand(1, 80, min_slots=50)
    high = JobDemand(2, 60, priority=1)
    b = policy.allocate(100, [low, high], {1: SlotRange(0, 80)})
    assert b[1] is None and b[2].size == 60


def test_priority_ties_go_to_the_earlier_job():
    policy = make_policy("priority")
    a, b = JobDemand(1, 80), JobDemand(2, 80)
    out = policy.allocate(100, [a, b], policy.allocate(100, [a], {}))
    assert out[1] == SlotRange(0, 80) and out[2] == SlotRange(80, 20)


def test_first_fit_compacts_when_free_space_is_fragmented():
    policy = make_policy("first-fit")
    a, b, c, d = JobDemand(1, 30), JobDemand(2, 30), JobDemand(3, 30), JobDemand(4, 35)
    alloc = policy.allocate(100, [a, b, c], {})
    assert alloc == {1: SlotRange(0, 30), 2: SlotRange(30, 30), 3: SlotRange(60, 30)}
    # b leaves: free space is [30, 60) and [90, 100), 40 slots but no gap of 35.
    held = {1: alloc[1], 3: alloc[3]}
    out = policy.allocate(100, [a, c, d], held)
    assert out[1] is held[1]  # already at slot 0: not moved
    assert out[3] == SlotRange(30, 30)  # slid toward 0
    assert out[4] == SlotRange(60, 35)


def test_first_fit_gives_the_largest_gap_when_total_space_is_short():
    policy = make_policy("first-fit")
    a, b, c = JobDemand(1, 30), JobDemand(2, 30), JobDemand(3, 30)
    held = {1: SlotRange(0, 30), 3: SlotRange(60, 30)}  # gaps of 30 and 10
    out = policy.allocate(100, [a, c, JobDemand(4, 50, min_slots=20)], held)
    assert out[4] == SlotRange(30, 30)
    out = policy.allocate(100, [a, c, JobDemand(4, 50, min_slots=31)], held)
    assert out[4] is None
    assert b.job_id not in out


def test_first_fit_upgrades_waiting_and_short_jobs_when_others_leave():
    policy = make_policy("first-fit")
    a, b, c = JobDemand(1, 60), JobDemand(2, 60, min_slots=50), JobDemand(3, 60, min_slots=10)
    alloc = policy.allocate(100, [a, b, c], {})
    assert alloc == {1: SlotRange(0, 60), 2: None, 3: SlotRange(60, 40)}  # b waits, c is short
    out = policy.allocate(100, [b, c], {3: alloc[3]})
    assert out[2] == SlotRange(0, 60)  # the waiting job is upgraded first (admission order)
    assert out[3] is alloc[3]  # short job keeps its range while its whole request does not fit
    out = policy.allocate(100, [c], {3: alloc[3]})
    assert out[3] == SlotRange(0, 60)  # and is upgraded to its whole request once it does


def test_first_fit_does_not_preempt_for_priority():
    policy = make_policy("first-fit")
    low, high = JobDemand(1, 100), JobDemand(2, 50, priority=9)
    alloc = policy.allocate(100, [low, high], policy.allocate(100, [low], {}))
    assert alloc == {1: SlotRange(0, 100), 2: None}


def test_equal_partitions_statically_and_leaves_unused_share_idle():
    policy = make_policy("equal")
    jobs = [JobDemand(1, 100), JobDemand(2, 10), JobDemand(3, 100)]
    out = policy.allocate(99, jobs, {})
    assert sizes(out) == {1: 33, 2: 10, 3: 33}  # job 2's unused 23 slots are not lent out
    assert policy.allocate(99, jobs + [JobDemand(4, 100, min_slots=30)], out)[4] is None  # 99 // 4 = 24 < 30


def test_equal_keeps_ranges_when_the_share_still_covers_requests():
    policy = make_policy("equal")
    jobs = [JobDemand(i, 20) for i in range(3)]
    out = policy.allocate(90, jobs, {})
    more = policy.allocate(90, jobs + [JobDemand(3, 20)], {k: v for k, v in out.items()})
    assert all(more[k] is out[k] for k in out) and more[3].size == 20


def test_weighted_shares_by_weight_and_redistributes_leftover():
    policy = make_policy("weighted")
    out = policy.allocate(100, [JobDemand(1, 100, weight=1), JobDemand(2, 100, weight=3)], {})
    assert sizes(out) == {1: 25, 2: 75}
    out = policy.allocate(100, [JobDemand(1, 10), JobDemand(2, 100)], {})
    assert sizes(out) == {1: 10, 2: 90}  # job 1 is capped; its unused half goes to job 2


def test_weighted_rounds_by_largest_remainder_then_admission_order():
    out = make_policy("weighted").allocate(10, [JobDemand(i, 10) for i in range(3)], {})
    assert sizes(out) == {0: 4, 1: 3, 2: 3}


def test_weighted_prefers_fewer_slots_to_none_and_later_jobs_yield_first():
    policy = make_policy("weighted")
    out = policy.allocate(10, [JobDemand(i, 10, min_slots=3) for i in range(3)], {})
    assert sizes(out) == {0: 4, 1: 3, 2: 3}  # everyone below their request but at or above min
    out = policy.allocate(10, [JobDemand(i, 10, min_slots=4) for i in range(3)], {})
    assert sizes(out) == {0: 5, 1: 5, 2: 0}  # 3.33 < 4: the latest job yields, the others re-share


def test_empty_pool_and_no_jobs():
    for name in ALL:
        policy = make_policy(name)
        assert policy.allocate(100, [], {}) == {}
        assert policy.allocate(0, [JobDemand(1, 5)], {}) == {1: None}


# --- interface ------------------------------------------------------------------------------------------


def test_make_policy_rejects_unknown_names_listing_valid_ones():
    with pytest.raises(ValueError, match="unknown allocation policy 'best'.*equal, first-fit, priority, weighted"):
        make_policy("best")


def test_registry_holds_the_four_policies_under_their_names():
    assert {"equal", "first-fit", "weighted", "priority"} <= set(POLICIES)
    for name, cls in POLICIES.items():
        assert cls.name == name and isinstance(make_policy(name), AllocationPolicy)


def test_a_registered_policy_is_available_by_name():
    @register_policy
    class HalfPolicy(SizedPolicy):
        name = "test-half"

        def sizes(self, pool_size, jobs):
            return {j.job_id: min(j.requested_slots, pool_size // 2) if i == 0 else 0 for i, j in enumerate(jobs)}

    try:
        assert make_policy("test-half").allocate(10, [JobDemand(1, 9)], {}) == {1: SlotRange(0, 5)}
        with pytest.raises(ValueError, match="already registered"):
            register_policy(type("Other", (HalfPolicy,), {"name": "test-half"}))
    finally:
        del POLICIES["test-half"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"requested_slots": 0}, "requested_slots must be >= 1"),
        ({"requested_slots": 4, "min_slots": 5}, "min_slots must be in"),
        ({"requested_slots": 4, "min_slots": 0}, "min_slots must be in"),
        ({"requested_slots": 4, "weight": 0.0}, "weight must be"),
        ({"requested_slots": 4, "weight": float("nan")}, "weight must be"),
    ],
)
def test_job_demand_rejects_nonsense(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JobDemand(job_id=1, **kwargs)
    with pytest.raises(TypeError):
        JobDemand(job_id=1, requested_slots=2.5)  # type: ignore[arg-type]


def test_slot_range_basics():
    rng = SlotRange(10, 5)
    assert rng.end == 15 and 10 in rng and 14 in rng and 15 not in rng
    assert rng.overlaps(SlotRange(14, 1)) and not rng.overlaps(SlotRange(15, 3))
    with pytest.raises(ValueError):
        SlotRange(-1, 3)
    with pytest.raises(ValueError):
        SlotRange(0, 0)


def test_allocate_rejects_bad_input():
    policy = make_policy("equal")
    with pytest.raises(ValueError, match="pool_size"):
        policy.allocate(-1, [], {})
    with pytest.raises(ValueError, match="twice"):
        policy.allocate(10, [JobDemand(1, 2), JobDemand(1, 3)], {})


def test_validate_allocation_catches_each_violation():
    jobs = [JobDemand(1, 10, min_slots=3), JobDemand(2, 10)]
    validate_allocation(20, jobs, {1: SlotRange(0, 10), 2: SlotRange(10, 10)})
    bad = [
        ({1: SlotRange(0, 10)}, "covers jobs"),
        ({1: SlotRange(0, 10), 2: SlotRange(15, 10)}, "exceeds pool"),
        ({1: SlotRange(0, 11), 2: None}, "requested"),
        ({1: SlotRange(0, 2), 2: None}, "min_slots"),
        ({1: SlotRange(0, 10), 2: SlotRange(5, 10)}, "overlapping"),
    ]
    for alloc, message in bad:
        with pytest.raises(ValueError, match=message):
            validate_allocation(20, jobs, alloc)
