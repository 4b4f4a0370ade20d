import pytest
import torch


@pytest.fixture(autouse=True)
def float64_by_default():
    """Exact comparisons against hand-computed values: run the algorithm tests in float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
