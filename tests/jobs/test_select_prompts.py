"""Pre-PPO prompt selection: the hardest prompts per domain, invariant to per-domain score scales."""

import json

from reasonrl.data.examples import Example
from reasonrl.jobs.prompt_sampling import write_jsonl
from reasonrl.jobs.select_prompts import merge, select_hardest

CANDIDATES = [Example(f"m{i}", f"math {i}", str(i), "math") for i in range(10)] + [
    Example(f"o{i}", f"open {i}", "ref", "open") for i in range(10)
]
MATH_SCORES = [0.9, 0.8, 0.1, 0.7, 0.95, 0.6, 0.85, 0.75, 0.65, 0.5]
OPEN_SCORES = [8.0, 9.0, 7.5, 9.5, 6.0, 8.5, 9.2, 8.8, 7.0, 9.9]  # another domain, another scale
SCORES = [*MATH_SCORES, *OPEN_SCORES]


def test_selection_keeps_the_lowest_within_domain_scores():
    picked = select_hardest(CANDIDATES, SCORES, 0.1)  # 2 of 20
    assert [e.id for e in picked] == ["m2", "o4"]  # raw scores would pick two math prompts


def test_selection_is_invariant_to_a_per_domain_affine_rescaling():
    rescaled = [3 * s - 1 for s in SCORES[:10]] + [0.01 * s + 40 for s in SCORES[10:]]
    for fraction in (0.1, 0.25, 0.5):
        assert select_hardest(CANDIDATES, SCORES, fraction) == select_hardest(CANDIDATES, rescaled, fraction)


def test_merge_keeps_the_base_and_adds_only_new_prompts(tmp_path):
    base = [Example("b0", "math 2", "2", "math"), Example("b1", "base only", "x", "math")]
    merged = merge(base, select_hardest(CANDIDATES, SCORES, 0.1))
    assert [e.id for e in merged] == ["b0", "b1", "o4"]
    rows = [json.loads(line) for line in write_jsonl(merged, tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows[2] == {"id": "o4", "question": "open 4", "answer": "ref", "task_type": "open"}


def test_an_unscored_candidate_stays_out_of_its_domains_statistics_and_the_selection():
    # m0's prompt was over rollout.max_prompt_tokens: never sampled, scored None.  Scored a score of inf
    # it made the math std NaN, every math z-score 0, and the selection took m0 (first in order).
    math = [Example(f"m{i}", f"math {i}", str(i), "math") for i in range(4)]
    assert select_hardest(math, [None, 0.9, 0.1, 0.5], 1 / 3) == [math[2]]  # keeps ceil(1/3 × 3 scored) = 1
    assert select_hardest(math, [None, 0.9, 0.1, 0.5], 1.0) == math[1:]


def test_unscored_candidates_do_not_shift_the_other_z_scores():
    # math scores 0.2, 0.4, 0.9: mean 0.5, population std 0.2944 -> z = -1.019, -0.340, 1.359;
    # open scores 7, 9: z = -1, 1.  The three lowest: m1 (-1.019), o0 (-1), m2 (-0.340).
    candidates = [
        Example("m0", "math 0", "0", "math"),
        Example("m1", "math 1", "1", "math"),
        Example("o0", "open 0", "ref", "open"),
        Example("m2", "math 2", "2", "math"),
        Example("o1", "open 1", "ref", "open"),
        Example("m3", "math 3", "3", "math"),
        Example("o2", "open 2", "ref", "open"),
    ]
    scores = [None, 0.2, 7.0, 0.4, 9.0, 0.9, None]
    assert [e.id for e in select_hardest(candidates, scores, 3 / 5)] == ["m1", "o0", "m2"]
    assert [e.id for e in select_hardest(candidates, scores, 2 / 5)] == ["m1", "o0"]


def test_a_domain_with_no_scored_candidate_contributes_nothing():
    candidates = [Example("c0", "code 0", "", "code"), *CANDIDATES[:10]]
    assert select_hardest(candidates, [None, *MATH_SCORES], 0.1) == [CANDIDATES[2]]
