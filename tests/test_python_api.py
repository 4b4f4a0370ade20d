"""``reasonrl.train(...)``: runs from Python with rows, reward functions, model objects and callbacks, and
docs/python-api.md's examples, run as the scripts they are."""

import logging
import math
import multiprocessing
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

import reasonrl
from reasonrl.cli import main
from reasonrl.config import ConfigError, parse_overrides
from reasonrl.data.loaders import DataError
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.rundir import RunDirError
from tests.train.test_loop import TINY

ROOT = Path(__file__).resolve().parents[1]
SMALL = {**parse_overrides(TINY[1:]), "reward.timeout_seconds": 60}  # TINY[0] is the model, given as model=
# tiny-random's template renders no tools: they are written into the system prompt, about 1.3k of its byte tokens
TOOLS_SHOWN = {"rollout.max_prompt_tokens": 2048, "train.microbatch_tokens": 4096}
ROWS = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "bonus": 0.25} for a in range(6) for b in range(6)]


def column_bonus(prompts, completions, bonus, **kwargs):
    """TRL's shape: the row's own ``bonus`` column, as TRL passes a dataset's columns."""
    return [float(value) for value in bonus]


def extra_info_weight(data_source, solution_str, ground_truth, extra_info):
    """verl's shape: the row's ``extra_info["weight"]`` for its data source ``mine``."""
    return {"score": extra_info["weight"] if data_source == "mine" else -1.0, "acc": False}


def broken_plot(record):
    raise ValueError("the plot failed")


class Warnings(logging.Handler):
    """The warnings logged while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """A 2-step run on a list of rows scored by a TRL-shaped function, watched by two callbacks (one raises);
    the run's result, what the first callback got, and the warnings logged."""
    run_dir = tmp_path_factory.mktemp("api") / "run"
    seen = []
    warnings = Warnings()
    logging.getLogger("reasonrl").addHandler(warnings)
    result = reasonrl.train(
        "grpo",
        model="tiny-random",
        dataset=ROWS,
        reward_funcs=[column_bonus],
        run_dir=run_dir,
        callbacks=[seen.append, broken_plot],
        progress=False,
        settings={**SMALL, "train.rollout_steps": 2},
    )
    logging.getLogger("reasonrl").removeHandler(warnings)
    return result, seen, warnings.records


def test_rows_and_a_trl_shaped_function_train_two_steps(trl_run):
    result, _, _ = trl_run
    assert result.summary["steps"] == 2
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["reward/fn/column_bonus/mean"] for r in records] == [0.25, 0.25]  # each row's column, as scored
    assert (result.run_dir / "dataset.jsonl").read_text().count("\n") == len(ROWS)


def test_a_callback_gets_every_record_and_one_that_raises_costs_nothing(trl_run):
    result, seen, warnings = trl_run
    written = [{k: v for k, v in r.items() if v is not None} for r in read_metrics(result.run_dir / "metrics.jsonl")]
    assert [r["step"] for r in seen] == [0, 1, 2]
    assert seen == [{k: v for k, v in r.items() if not isinstance(v, float) or math.isfinite(v)} for r in written]
    assert sorted(p.name for p in (result.run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))[-1] == (
        "step-000002"
    )
    failures = [w for w in warnings if "metrics callback" in w.getMessage()]
    assert [w.getMessage() for w in failures] == [
        "metrics callback broken_plot raised at step 0; the run goes on (its later failures are not logged)"
    ]
    assert "ValueError: the plot failed" in logging.Formatter().formatException(failures[0].exc_info)


def test_a_verl_shaped_function_scores_a_datasets_table(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{**row, "data_source": "mine", "extra_info": {"weight": 0.75}} for row in ROWS]
    result = reasonrl.train(
        "grpo",
        model="tiny-random",
        dataset=datasets.Dataset.from_list(rows),
        reward_funcs=extra_info_weight,
        run_dir=tmp_path / "run",
        progress=False,
        **SMALL,
        **{"train.rollout_steps": 2},
    )
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["reward/fn/extra_info_weight/mean"] for r in records] == [0.75, 0.75]


def test_a_bad_setting_fails_with_the_config_loaders_error_before_anything_is_written(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'train\.rollout_stpes'; did you mean 'train\.rollout_steps'\?$"
    ):
        reasonrl.train("grpo", dataset=ROWS, run_dir=tmp_path / "run", **{"train.rollout_stpes": 2})
    with pytest.raises(ConfigError, match=r"^model= and model\.name_or_path name the same thing; give each once$"):
        reasonrl.train("grpo", model="tiny-random", run_dir=tmp_path / "run", **{"model.name_or_path": "x"})
    assert not (tmp_path / "run").exists()


def test_a_bad_row_fails_with_the_data_layers_error(tmp_path):
    rows = [ROWS[0], {"q": "What is 1 + 1?", "answer": "2"}]
    with pytest.raises(
        DataError,
        match=re.escape("dataset[1]: no field 'question' (fields present: q, answer); set data.question_field"),
    ):
        reasonrl.train("grpo", dataset=rows, run_dir=tmp_path / "run")
    with pytest.raises(DataError, match=re.escape("eval_dataset[0]: expected a mapping of fields (a dict), got str")):
        reasonrl.train("grpo", dataset=ROWS, eval_dataset=["What is 1 + 1?"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_functions_the_reward_workers_cannot_import_are_refused_with_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"is a lambda or is defined inside a function.*define it at the top level"):
        reasonrl.train("grpo", reward_funcs=[lambda prompts, completions, **kw: [1.0]], run_dir=tmp_path / "run")

    def in_a_notebook(prompts, completions, **kwargs):
        return [1.0]

    in_a_notebook.__module__, in_a_notebook.__qualname__ = "__main__", "in_a_notebook"
    monkeypatch.delattr(sys.modules["__main__"], "__file__", raising=False)  # as in Jupyter or a REPL
    with pytest.raises(ConfigError, match=r"defined in a notebook.*%%writefile rewards\.py"):
        reasonrl.train("grpo", reward_funcs=in_a_notebook, run_dir=tmp_path / "run")


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path, monkeypatch):
    # a spawned reward worker runs the script again as a module: unguarded, it would call train() there
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r'guard the script\'s entry point with `if __name__ == "__main__":`'):
        reasonrl.train("grpo", dataset=ROWS, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_directory_that_holds_no_run_is_refused_before_anything_is_written_or_removed(tmp_path, monkeypatch):
    import reasonrl.api

    mine = tmp_path / "mine"  # someone's directory: a model and notes, no run
    (mine / "final").mkdir(parents=True)
    (mine / "final" / "model.safetensors").write_text("my model")
    (mine / "summary.md").write_text("my notes")
    monkeypatch.setattr(reasonrl.api, "fit", lambda *args, **kwargs: pytest.fail("the run started"))
    with pytest.raises(RunDirError, match=rf"^{re.escape(str(mine))} is not empty and holds no run \(no run\.lock"):
        reasonrl.train("grpo", model="tiny-random", dataset=ROWS, run_dir=mine, settings=SMALL)
    kept = {str(p.relative_to(mine)): p.read_text() for p in mine.rglob("*") if p.is_file()}
    assert kept == {"final/model.safetensors": "my model", "summary.md": "my notes"}  # no dataset.jsonl, no run.lock


def test_calling_again_with_more_steps_continues_the_run_of_a_model_object(tmp_path, caplog):
    from reasonrl.models.load import load_model

    model = load_model("tiny-random")
    run = {"model": model, "dataset": ROWS, "reward_funcs": [column_bonus], "run_dir": tmp_path / "run"}
    reasonrl.train("grpo", **run, progress=False, settings={**SMALL, "train.rollout_steps": 1})
    caplog.set_level(logging.INFO, logger="reasonrl")
    result = reasonrl.train("grpo", **run, progress=False, settings={**SMALL, "train.rollout_steps": 2})
    assert result.summary["steps"] == 2
    assert "resuming from" in caplog.text and "(step 1)" in caplog.text
    assert [r["step"] for r in read_metrics(result.run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert (result.run_dir / "initial_model" / "model.safetensors").is_file()
    next(model.parameters()).data.add_(1.0)
    with pytest.raises(RunDirError, match=r"holds a run of other inputs: its initial_model is not the model given"):
        reasonrl.train("grpo", **run, settings={**SMALL, "train.rollout_steps": 3})
    with pytest.raises(RunDirError, match=r"its dataset\.jsonl is not the dataset given"):
        reasonrl.train("grpo", **{**run, "model": "tiny-random", "dataset": ROWS[1:]}, settings=SMALL)


def test_an_environment_class_becomes_the_runs_environment_by_its_name(tmp_path):
    from tests.rollout.test_trl_environments import Vault

    result = reasonrl.train(
        "grpo", model="tiny-random", dataset=ROWS, environment=Vault, run_dir=tmp_path / "run", progress=False,
        settings={**SMALL, **TOOLS_SHOWN, "train.rollout_steps": 1, "rollout.max_turns": 2},
    )  # fmt: skip
    config = (result.run_dir / "config.yaml").read_text()
    assert "environment: tests.rollout.test_trl_environments:Vault" in config and "multiturn: env" in config
    (record,) = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["step"] == 1]
    assert record["multiturn/environment_error_fraction"] == 0.0  # each episode played a Vault of its own


def test_trls_argument_names_point_at_reasonrls(tmp_path):
    """GRPOTrainer's names, as a TRL user passes them, are refused naming what reasonrl.train takes."""
    for trl_name, ours in [("environment_factory", "environment="), ("train_dataset", "dataset="),
                           ("processing_class", "tokenizer=")]:  # fmt: skip
        with pytest.raises(ConfigError, match=rf"^{trl_name}= is TRL's name; reasonrl.train takes {ours}"):
            reasonrl.train("grpo", model="tiny-random", run_dir=tmp_path / "run", **{trl_name: object()})
    assert not (tmp_path / "run").exists()


def test_any_zero_argument_factory_is_an_environment_as_trl_takes_it(tmp_path):
    """TRL calls ``environment_factory`` with no arguments: a functools.partial (or a class defined in a function)
    plays in this process; the run records it as an object the command line cannot rebuild."""
    import functools

    from tests.rollout.test_trl_environments import Vault

    class Local(Vault):
        """A class no other process can import."""

    for factory in (functools.partial(Vault), Local):
        result = reasonrl.train(
            "grpo", model="tiny-random", dataset=ROWS, environment=factory, run_dir=tmp_path / type(factory).__name__,
            progress=False, settings={**SMALL, **TOOLS_SHOWN, "train.rollout_steps": 1, "rollout.max_turns": 2},
        )  # fmt: skip
        (record,) = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["step"] == 1]
        assert record["multiturn/environment_error_fraction"] == 0.0
        assert "environment: object:" in (result.run_dir / "config.yaml").read_text()


def test_an_environment_that_cannot_be_named_or_set_twice_is_refused_with_what_to_do(tmp_path):
    class Local:
        def reset(self, **kwargs):
            return None

    refusals = {
        "environment= takes an environment class": {"environment": Local()},
        "environment= and rollout.environment name the same thing": {
            "environment": "countdown", "rollout.environment": "countdown"
        },
        "environment= sets rollout.multiturn=env; leave rollout.multiturn out": {
            "environment": "countdown", "rollout.multiturn": "pag"
        },
    }  # fmt: skip
    for message, arguments in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            reasonrl.train("grpo", dataset=ROWS, run_dir=tmp_path / "run", **arguments)
    assert not (tmp_path / "run").exists()


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("index", range(len(python_blocks(ROOT / "docs" / "python-api.md"))))
def test_the_docs_examples_run_as_scripts(index, tmp_path, capsys):
    code = python_blocks(ROOT / "docs" / "python-api.md")[index]
    if "import datasets" in code and find_spec("datasets") is None:
        pytest.skip("the example needs `datasets` (pip install 'reasonrl[data]')")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = [path.parents[1] for path in (tmp_path / "runs").glob("*/final/model.safetensors")]
    assert runs, done.stderr[-4000:]
    for run_dir in runs:  # its reward functions or environment live in the script: the script resumes it
        assert main(["train", "--resume", str(run_dir)]) == 2
        said = capsys.readouterr().err
        assert f"resume it by calling reasonrl.train(..., run_dir={str(run_dir)!r}) again with the same " in said
        assert re.search(r"again with the same (reward function|environment) __main__:", said)
