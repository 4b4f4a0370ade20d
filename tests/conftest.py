"""Isolation every test gets: the SIGINT handler as Python installs it (Ctrl-C's checkpointing,
``reasonrl.training.record.interrupt``, takes part only where nothing else handles SIGINT), restored after each
test whatever the test or a library it ran left behind."""

import signal

import pytest


@pytest.fixture(autouse=True)
def default_sigint_handler():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)
