"""The scoring pool: errors, hangs and crashes of a reward function never stop scoring."""

import time

from reasonrl.reward.math import MathVerifier
from reasonrl.reward.scoring_pool import ScoringPool
from tests.helpers import ExitsOn, HangsOn, RaisesOn


def test_scores_in_order():
    with ScoringPool(MathVerifier(), workers=2, timeout=20) as pool:
        results = pool.score([("Answer: 1", "1"), ("Answer: 2", "3"), ("\\boxed{4}", "4")])
    assert [r.correct for r in results] == [True, False, True]


def test_a_raising_reward_function_gives_an_error_marked_score(caplog):
    with ScoringPool(RaisesOn("boom"), workers=1, timeout=20, error_score=-1.0) as pool:
        results = pool.score([("a", "a"), ("boom", "a"), ("b", "b"), ("boom!", "a")])
    assert [r.correct for r in results] == [True, False, True, False]
    assert results[1].score == -1.0
    assert results[1].info["error"].startswith("ValueError: cannot score 'boom'")
    # the first failure alone is logged, with the traceback from the function's own frame down
    assert [r.getMessage().splitlines()[0] for r in caplog.records] == [
        "reward function failed on response 1 (later failures are counted, not logged):"
    ]
    traceback = caplog.records[0].getMessage().splitlines()[1:]
    assert traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "ValueError: cannot score 'boom'"
    assert 'helpers.py", line' in traceback[1] and "in __call__" in traceback[1]
    assert "pool.py" not in "".join(traceback)  # the worker's frames that only call it are left out


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
