"""Bounded samples (specproxy.analysis.figures.sample): a reservoir that keeps everything up to its size and a
uniform sample beyond it, the same for the same seed; a per-key sample that keeps the same keys whatever the order."""

from __future__ import annotations

import random

from specproxy.analysis.figures.sample import KeySample, Reservoir, key_hash


def test_a_reservoir_keeps_everything_up_to_its_size() -> None:
    r: Reservoir[int] = Reservoir(5)
    for i in range(5):
        r.add(i)
    assert (r.items, r.seen, r.sampled) == ([0, 1, 2, 3, 4], 5, False)
    r.add(5)
    assert (len(r.items), r.seen, r.sampled) == (5, 6, True)
    assert set(r.items) <= set(range(6))


def test_a_reservoir_is_deterministic_per_seed() -> None:
    def fill(seed: int) -> list[int]:
        r: Reservoir[int] = Reservoir(10, seed)
        for i in range(1000):
            r.add(i)
        return r.items

    assert fill(3) == fill(3)
    assert fill(3) != fill(4)


def test_a_reservoir_sample_is_uniform() -> None:
    # each of 100 items is kept with probability 10/100: over 2,000 seeded reservoirs, the first and the last ten
    # items are kept about equally often (the expected count is 200 each; 4 standard deviations is ~54)
    first = last = 0
    for seed in range(2000):
        r: Reservoir[int] = Reservoir(10, seed)
        for i in range(100):
            r.add(i)
        first += sum(1 for x in r.items if x < 10)
        last += sum(1 for x in r.items if x >= 90)
    assert abs(first - 2000) < 250 and abs(last - 2000) < 250


def test_a_key_sample_keeps_everything_under_its_capacity() -> None:
    s = KeySample(capacity=10)
    for i in range(10):
        s.add(f"k{i}", float(i))
    s.add("k0", 99.0)
    assert (len(s.values), s.values["k0"], s.sampled) == (10, [0.0, 99.0], False)


def test_past_its_capacity_the_threshold_halves_and_only_keys_under_it_stay() -> None:
    s = KeySample(capacity=50)
    keys = [f"request-{i}" for i in range(400)]
    for k in keys:
        s.add(k, 1.0)
    assert s.sampled and len(s.values) <= 50 and s.threshold < 1 << 32
    assert set(s.values) == {k for k in keys if key_hash(k) < s.threshold}
    # and with the threshold known, a key over it is refused at once
    over = next(k for k in (f"x{i}" for i in range(1000)) if key_hash(k) >= s.threshold)
    s.add(over, 1.0)
    assert over not in s.values


def test_two_samples_of_the_same_keys_in_another_order_keep_the_same_keys() -> None:
    keys = [f"r{i}" for i in range(1000)]
    a, b = KeySample(capacity=64), KeySample(capacity=64)
    for k in keys:
        a.add(k, 1.0)
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    for k in shuffled:
        b.add(k, 2.0)
    assert set(a.values) == set(b.values) and a.threshold == b.threshold
