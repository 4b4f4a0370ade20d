"""Task-mix schedules: realised fractions follow the schedule; the sampler resumes exactly."""

import pytest

from reasonrl.data.curriculum import ScheduleError, TaskMixSampler, parse_task_mix
from reasonrl.data.examples import Example

ROWS = (
    [Example(f"m{i}", f"q{i}", "1", "math") for i in range(30)]
    + [Example(f"c{i}", f"c{i}", "t", "code") for i in range(20)]
    + [Example(f"o{i}", f"o{i}", "r", "open") for i in range(50)]
)
TYPES = ["code", "math", "open"]


def fractions(examples):
    return {t: sum(e.task_type == t for e in examples) / len(examples) for t in TYPES}


def test_realised_fractions_match_the_math_code_first_schedule():
    sampler = TaskMixSampler(ROWS, parse_task_mix(["0:math=3,code=1", "10:natural"], TYPES), seed=0)
    first = [e for step in range(10) for e in sampler.take(100, step)]
    later = [e for step in range(10, 20) for e in sampler.take(100, step)]
    assert fractions(first)["open"] == 0.0
    assert fractions(first)["math"] == pytest.approx(0.75, abs=0.03)
    assert fractions(later) == pytest.approx({"math": 0.3, "code": 0.2, "open": 0.5}, abs=0.03)


def test_every_row_of_a_type_comes_once_per_epoch_and_resume_is_exact():
    sampler = TaskMixSampler(ROWS, parse_task_mix(["0:code=1"], TYPES), seed=3)
    epoch = sampler.take(20, 0)
    assert sorted(e.id for e in epoch) == sorted(f"c{i}" for i in range(20))
    state = sampler.state_dict()
    expected = sampler.take(7, 0)
    restored = TaskMixSampler(ROWS, parse_task_mix(["0:code=1"], TYPES), seed=3)
    restored.load_state_dict(state)
    assert restored.take(7, 0) == expected


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["5:math=1"], "start at step 0"),
        (["0:poetry=1"], "not in the data"),
        (["zero:math=1"], "step number"),
        (["0:math=0"], "positive sum"),
    ],
)
def test_malformed_schedules_are_refused(entries, message):
    with pytest.raises(ScheduleError, match=message):
        parse_task_mix(entries, TYPES)
