"""The scoring pool: errors, hangs and crashes of a reward function never stop scoring."""

import time

from reasonrl.reward.math import MathVerifier
from reasonrl.reward.pool import ScoringPool
from tests.helpers import ExitsOn, HangsOn, RaisesOn


def test_scores_in_order():
    with ScoringPool(MathVerifier(), workers=2, timeout=20) as pool:
        results = pool.score([("Answer: 1", "1"), ("Answer: 2", "3"), ("\\boxed{4}", "4")])
    assert [r.correct for r in results] == [True, False, True]


def test_a_raising_reward_function_gives_an_error_marked_score(caplog):
    with ScoringPool(RaisesOn("boom"), workers=2, timeout=20, error_score=-1.0) as pool:
        results = pool.score([("a", "a"), ("boom", "a"), ("b", "b")])
    assert [r.correct for r in results] == [True, False, True]
    assert results[1].score == -1.0
    assert results[1].info["error"].startswith("ValueError: cannot score 'boom'")
    assert "reward function failed" in caplog.text


def test_a_hanging_reward_function_times_out_and_scoring_goes_on(caplog):
    pairs = [("a", "a"), ("zz-hang", "a"), ("b", "b"), ("c", "x"), ("hang", "a"), ("d", "d")]
    start = time.monotonic()
    with ScoringPool(HangsOn("hang"), workers=2, timeout=1.0) as pool:
        results = pool.score(pairs)
        again = pool.score([("e", "e")])  # the pool still works afterwards
    assert time.monotonic() - start < 15
    assert [r.correct for r in results] == [True, False, True, False, False, True]
    assert results[1].info["error"] == "timeout after 1s" and results[4].info["error"] == "timeout after 1s"
    assert again[0].correct
    assert "timed out" in caplog.text


def test_a_reward_function_that_kills_its_process_is_contained():
    with ScoringPool(ExitsOn("die"), workers=1, timeout=20) as pool:
        results = pool.score([("a", "a"), ("die", "a"), ("b", "b")])
    assert [r.correct for r in results] == [True, False, True]
    assert results[1].info["error"] == "the scoring process died"
