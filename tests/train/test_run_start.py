"""What a run says and chooses at its start: torch's threads, prompts longer than the cap and the held-out set
(both checked before any model loads), and the summary's held-out count and reproduce command."""

import json
import logging
import re
import shlex
import subprocess
import sys

import pytest
import torch

import reasonrl.training.setup as run_setup
from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.data.loaders import DataError
from reasonrl.training.loop import fit
from reasonrl.training.placement import cpu_threads
from reasonrl.training.placement.cpu_threads import choose_threads
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.report import write_summary
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY


def test_threads_follow_the_setting_then_omp_num_threads_then_the_cores_other_work_leaves_free():
    # the user's machine: 2 cores at a load of 3-4 -> one thread (20.2 s a step, not 309.6 s)
    assert choose_threads(2, 3.5, None, None).threads == 1
    assert choose_threads(2, 0.1, None, None).threads == 2  # an idle machine: every core
    assert choose_threads(16, 3.4, None, None).threads == 13  # 12.6 free cores
    assert choose_threads(8, 0.0, None, "").threads == 8
    assert choose_threads(4, 40.0, None, None).threads == 1  # never below one
    assert choose_threads(2, 3.5, None, "4").threads == 4  # the user's OMP_NUM_THREADS (torchrun's too)
    assert choose_threads(2, 3.5, None, "3,1").threads == 3  # nested levels: the first
    assert choose_threads(2, 3.5, None, "many").source == "auto"  # not a number: as if unset
    assert choose_threads(2, 3.5, 6, "4").threads == 6  # run.threads wins
    line = choose_threads(2, 3.456, None, None).describe()
    assert line.startswith("threads: 1 of 2 cores, load 3.46 (auto: the cores other work leaves free")


def test_the_busy_cores_are_the_work_running_now_and_lately_on_this_process_s_share_of_the_machine(monkeypatch):
    def machine(load, running, cpus):
        monkeypatch.setattr(cpu_threads, "load_average", lambda: load)
        monkeypatch.setattr(cpu_threads, "running_elsewhere", lambda: running)
        monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: cpus)

    machine(load=3.5, running=3.0, cpus=2)
    assert cpu_threads.busy_cores(2) == 3.0
    machine(load=1.2, running=0.0, cpus=2)  # a package install a minute ago, nothing now: every core is free
    assert cpu_threads.busy_cores(2) == 0.0
    machine(load=0.5, running=4.0, cpus=2)  # a burst of short tasks now, an idle minute
    assert cpu_threads.busy_cores(2) == 0.5
    machine(load=8.0, running=8.0, cpus=16)  # 2 of a 16-core machine's cores: their share of its load
    assert cpu_threads.busy_cores(2) == 1.0
    machine(load=3.5, running=None, cpus=2)  # no /proc/loadavg: the load average alone
    assert cpu_threads.busy_cores(2) == 3.5


def test_idle_openmp_threads_sleep_on_a_busy_machine_where_torch_is_not_loaded_yet():
    code = (
        "import sys\n"
        "import reasonrl.cli, reasonrl.data.source\n"  # `reasonrl train` decides before it imports torch
        "from reasonrl.training.placement.cpu_threads import sleeping_openmp_threads as sleeping\n"
        "print('torch' in sys.modules)\n"
        "busy, idle, chosen = {}, {}, {'OMP_WAIT_POLICY': 'ACTIVE'}\n"
        "print(sleeping(busy, load=3.0), busy, sleeping(idle, load=0.2), idle, sleeping(chosen, load=3.0), chosen)\n"
        "import torch\n"
        "late = {}\n"
        "print(sleeping(late, load=3.0), late)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "False",
        "True {'OMP_WAIT_POLICY': 'PASSIVE'} False {} False {'OMP_WAIT_POLICY': 'ACTIVE'}",
        "False {}",  # OpenMP has read its settings: too late
    ]


@pytest.fixture
def no_model_loads(monkeypatch):
    """A run that reaches the loading of a model stops there."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(run_setup, "load_model", refuse)


def chat_rows(path, lengths):
    """A jsonl file of chat-format rows whose user messages are ``lengths`` characters long."""
    rows = [{"prompt": [{"role": "user", "content": "x" * n}], "answer": "1"} for n in lengths]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_prompts_mostly_longer_than_the_cap_stop_the_run_before_any_model_loads(tmp_path, no_model_loads):
    # tiny-random's byte-level tokenizer: a 300-character question is over the default 256-token cap
    dataset = chat_rows(tmp_path / "long.jsonl", [300] * 20)
    cfg = load_config("grpo", [*TINY, f"data.dataset={dataset}", "train.rollout_steps=1"])
    message = (
        r"^16 of the first 16 training prompts are longer than rollout.max_prompt_tokens=256 \(median (\d+), "
        r"longest (\d+) tokens, chat template included\) and would be skipped; "
        r"set rollout.max_prompt_tokens=(\d+) to fit them$"
    )
    with pytest.raises(DataError, match=message) as error:
        fit(cfg, tmp_path / "run", verifier=DigitFraction(), show_progress=False)
    median, longest, fits = map(int, re.match(message, str(error.value)).groups())
    assert 300 < median == longest == fits
    assert not (tmp_path / "run").exists()  # a run that fails before its first step leaves nothing


def test_some_prompts_longer_than_the_cap_are_warned_with_their_share(tmp_path, no_model_loads, caplog):
    dataset = chat_rows(tmp_path / "mixed.jsonl", [300] * 3 + [20] * 17)  # rows 0-2 long; row 4 is held out
    cfg = load_config("grpo", [*TINY, f"data.dataset={dataset}", "train.rollout_steps=1"])
    caplog.set_level(logging.INFO, logger="reasonrl")
    with pytest.raises(AssertionError, match="a model was loaded"):
        fit(cfg, tmp_path / "run", verifier=DigitFraction(), show_progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        re.fullmatch(
            r"3 of the first 16 training prompts \(19%\) are longer than rollout.max_prompt_tokens=256 "
            r"\(longest \d+ tokens\) and will be skipped; rollout.max_prompt_tokens=\d+ keeps them",
            w,
        )
        for w in warnings
    ), warnings


def test_an_empty_held_out_set_is_warned_before_any_model_loads(tmp_path, no_model_loads, caplog):
    dataset = tmp_path / "three.jsonl"
    dataset.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    cfg = load_config("grpo", [*TINY, f"data.dataset={dataset}", "train.rollout_steps=1"])
    caplog.set_level(logging.INFO, logger="reasonrl")
    with pytest.raises(AssertionError, match="a model was loaded"):
        fit(cfg, tmp_path / "run", verifier=DigitFraction(), show_progress=False)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"no held-out prompt to evaluate on: the hold-out of data.dataset={dataset} (one row in 5, by position) is "
        "empty, so the held-out accuracy would be measured on 0 prompts; give held-out rows with data.eval_dataset, "
        "at least 5 rows in data.dataset, or set data.eval_prompts=0 to skip the evaluation"
    ]


def test_a_summary_without_held_out_prompts_claims_no_accuracy(tmp_path):
    summary = {"preset": "grpo", "model": "m", "steps": 1, "eval_prompts": 0, "accuracy_before": 0.0,
               "accuracy_after": 0.0, "wall_seconds": 6.0, "peak_rss_gb": 1.0, "plot": "p.png", "final_model": "final",
               "overrides": []}  # fmt: skip
    write_summary(tmp_path, summary)
    text = (tmp_path / "summary.md").read_text()
    assert "- held-out accuracy: not measured (no held-out prompt was evaluated)" in text and "%" not in text


def test_a_run_logs_its_threads_and_summarises_the_held_out_prompts_it_evaluated(tmp_path, capsys):
    dataset = tmp_path / "sums.jsonl"  # 30 rows: 6 held out, fewer than data.eval_prompts=8
    dataset.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(30)))
    overrides = [*TINY, f"data.dataset={dataset}", "train.rollout_steps=1", "run.threads=1"]
    overrides += ["data.system_prompt=Answer briefly.", "run.loggers=[tensorboard]"]  # a space, a list
    assert main(["train", "grpo", *overrides, f"run.output_dir={tmp_path}", "run.name=r", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"INFO +threads: 1 of \d+ cores, load \d+\.\d\d \(run\.threads=1", err), err
    assert torch.get_num_threads() == 1
    notice = f"the held-out evaluation uses 6 prompts, not data.eval_prompts=8: the hold-out of data.dataset={dataset}"
    assert "".join(notice.split()) in "".join(err.split())  # (as the log wraps it)
    run_dir = tmp_path / "r"
    assert json.loads((run_dir / "summary.json").read_text())["eval_prompts"] == 6
    assert [r["eval/prompts"] for r in read_metrics(run_dir / "metrics.jsonl") if "eval/prompts" in r] == [6, 6]
    summary = (run_dir / "summary.md").read_text()
    assert "- held-out accuracy (greedy, 6 prompts): " in summary
    command = re.fullmatch(r"Reproduce: `(.*)`", summary.splitlines()[-1]).group(1)
    assert shlex.split(command) == ["reasonrl", "train", "grpo", *overrides, f"run.output_dir={tmp_path}", "run.name=r"]


def test_the_summary_says_what_its_accuracy_counts():
    """A format reward alone once read as 100% held-out accuracy: the summary and the command line say whether the
    accuracy is the verifier's verdict, a function's, an environment's success, or a reward above 0.5."""
    from reasonrl.config import load_config
    from reasonrl.training.record.report import _accuracy_line, accuracy_meaning

    assert accuracy_meaning(load_config("grpo")).startswith("the verifier's verdict")
    functions = load_config("grpo", ["reward.functions=[tests.reward_functions:digit_share]"])
    assert accuracy_meaning(functions) == (
        "a reward function's verdict (verl's acc) where one gives it, else the summed reward above 0.5"
    )
    listed = load_config("grpo", ["reward.functions=[verifier,tests.reward_functions:digit_share]"])
    assert accuracy_meaning(listed).startswith("the verifier's verdict")
    environment = load_config("guess_number")
    assert accuracy_meaning(environment).startswith("episodes solved")
    line = _accuracy_line(8, 0.25, 0.5, accuracy_meaning(functions))
    assert line.endswith("(+25.0 points); accuracy = a reward function's verdict (verl's acc) where one gives it, "
                         "else the summed reward above 0.5")  # fmt: skip
