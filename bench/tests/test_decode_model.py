"""bench/decode_model.py: the split kernel's model reduces to closed forms where one limit binds,
and reads the fixed-split measurements it is fitted to."""
import os

import pytest

from bench import decode_model as dm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_one_cta_an_sm_streams_at_the_cta_rate():
    r = dm.Rates(cta_rate=30.0, sm_rate=1000.0, fixed=4.0, combine=2.0, hbm=1e9, sms=16)
    # 2 sequences x 8 KV heads = 16 CTAs on 16 SMs, 1000 keys each: 0.512 MB at 30 GB/s.
    assert dm.call_us(2, 1000, 1, r) == pytest.approx(4.0 + 0.512 / 30.0 * 1e3)
    # Two splits: 32 CTAs two an SM, each at min(30, 1000 / 2), plus the combine.
    assert dm.call_us(2, 1000, 2, r) == pytest.approx(4.0 + 0.256 / 30.0 * 1e3 + 2.0)


def test_two_ctas_share_their_sm_rate_and_the_hbm_caps_all():
    r = dm.Rates(cta_rate=100.0, sm_rate=40.0, fixed=0.0, combine=0.0, hbm=1e9, sms=8)
    assert dm.call_us(2, 1000, 1, r) == pytest.approx(0.512 / 20.0 * 1e3)  # 16 CTAs on 8 SMs
    capped = dm.Rates(cta_rate=100.0, sm_rate=40.0, fixed=0.0, combine=0.0, hbm=80.0, sms=8)
    # 8 SMs could draw 320 GB/s; 80 is all there is: 16 x 0.512 MB at 80 GB/s.
    assert dm.call_us(2, 1000, 1, capped) == pytest.approx(16 * 0.512 / 80.0 * 1e3)


def test_a_third_slot_takes_the_ctas_a_second_round_would():
    two = dm.Rates(cta_rate=10.0, sm_rate=1000.0, fixed=1.0, combine=0.0, hbm=1e9, slots=2, sms=8)
    three = dm.Rates(cta_rate=10.0, sm_rate=1000.0, fixed=1.0, combine=0.0, hbm=1e9, slots=3, sms=8)
    # 3 x 8 = 24 CTAs: two rounds with two slots an SM, one with three.
    one_round = 1.0 + 0.512 / 10.0 * 1e3
    assert dm.call_us(3, 1000, 1, two) == pytest.approx(2 * one_round)
    assert dm.call_us(3, 1000, 1, three) == pytest.approx(one_round)


def test_reads_the_fixed_split_points_of_a_decode_csv():
    points, cudnn = dm.read_fixed_splits(os.path.join(ROOT, "bench/results/h200-decode-fixed-splits-tma-2026-12-03.csv"))
    assert len(points) == 75 and set(s for _, _, s in points) == {1, 2, 3, 4, 6}
    assert points[(8, 2048, 4)] == pytest.approx(23.1, abs=0.1)
    assert len(cudnn) == 15 and cudnn[(12, 2048)] == pytest.approx(28.4, abs=0.1)


def test_balanced_shares_cost_a_segment_for_each_pair_they_span():
    r = dm.Rates(cta_rate=10.0, sm_rate=1000.0, fixed=1.0, combine=2.0, hbm=1e9, slots=1, sms=12)
    # 2 sequences x 8 KV heads = 16 pairs of 0.512 MB over 12 CTAs: 0.683 MB a share, which spans
    # at most 3 pairs (a share longer than one pair, starting inside one): 2 segments more.
    share = 16 * 0.512 / 12
    assert dm.balanced_us(2, 1000, r, segment=0.5) == pytest.approx(1.0 + 2 * 0.5 + share / 10.0 * 1e3 + 2.0)
    # Shares of exactly one pair (16 CTAs) span one.
    even = dm.Rates(cta_rate=10.0, sm_rate=1000.0, fixed=1.0, combine=2.0, hbm=1e9, slots=1, sms=16)
    assert dm.balanced_us(2, 1000, even, segment=0.5) == pytest.approx(1.0 + 0.512 / 10.0 * 1e3 + 2.0)
