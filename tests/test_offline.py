"""A machine without a network: a hub model or dataset fails at once with one line that says what to do,
a hub model already in the Hugging Face cache loads from it, and each Hub warning prints once.

No test here reaches the network: the Hub is a closed port on this machine."""

import shutil
import subprocess
import sys
import time

import pytest

from reasonrl.cli import main
from reasonrl.models.load import resolve_model

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """huggingface_hub (and `datasets`) pointed at a closed local port, with an empty Hugging Face cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", CLOSED + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    try:
        import datasets.config

        monkeypatch.setattr(datasets.config, "HF_ENDPOINT", CLOSED)
    except ImportError:
        pass
    return tmp_path / "hub"


def error_lines(err):
    return [line for line in err.splitlines() if line.strip()]


def test_a_hub_model_without_a_network_fails_at_once_with_one_line(no_network, capsys):
    started = time.monotonic()
    assert main(["eval", "--model", "some-org/some-model"]) == 1
    assert time.monotonic() - started < 15  # was 70 s: two rounds of five retries
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(
        f"reasonrl: error: could not load 'some-org/some-model': the Hugging Face Hub ({CLOSED}) cannot be reached "
    )
    assert "HF_HUB_OFFLINE=1" in line and "or give a local path: a model directory" in line


def test_a_hub_dataset_without_a_network_fails_at_once_with_one_line(no_network, capsys):
    pytest.importorskip("datasets")
    started = time.monotonic()
    assert main(["eval", "--model", "tiny-random", "--dataset", "some-org/some-data"]) == 1
    assert time.monotonic() - started < 15  # was 33 s of retries
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"reasonrl: error: could not load 'some-org/some-data': the Hugging Face Hub ({CLOSED})")
    assert "set HF_HUB_OFFLINE=1" in line and "or give a local .jsonl or .parquet file" in line


def test_a_hub_model_in_the_cache_loads_without_a_network(no_network, capsys):
    snapshot = no_network / "models--some-org--some-model" / "snapshots" / "0123abcd"
    shutil.copytree(resolve_model("tiny-random"), snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    started = time.monotonic()
    assert main(["eval", "--model", "some-org/some-model", "--limit", "1", "--max-new-tokens", "2", "--quiet"]) == 0
    assert time.monotonic() - started < 15  # no retries of files the cache does not hold
    assert "Retrying" not in capsys.readouterr().err


def test_a_hub_warning_prints_once():
    code = (
        "from reasonrl.cli import main\n"
        "main(['presets'])\n"
        "from huggingface_hub.utils import logging\n"
        "logging.get_logger('huggingface_hub.file_download').warning('the hub says hello')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stderr.count("the hub says hello") == 1
