"""Importing the package, the math and the config never loads a heavy engine."""

import subprocess
import sys

HEAVY = ("ray", "vllm", "deepspeed", "transformers")


def test_core_imports_load_no_engine():
    code = (
        "import sys\n"
        "import reasonrl, reasonrl.algo, reasonrl.config, reasonrl.cli, reasonrl.reward, reasonrl.reward.scoring_pool\n"
        "from reasonrl.algo import advantage_estimators, aggregate, kl, masked, pag, policy_loss, presets\n"
        "from reasonrl.algo import shaping, value_loss\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_algo_imports_nothing_beyond_torch():
    code = (
        "import sys\n"
        "import torch\n"
        "before = set(sys.modules)\n"
        "import reasonrl.algo.advantage_estimators, reasonrl.algo.aggregate, reasonrl.algo.kl, reasonrl.algo.pag\n"
        "import reasonrl.algo.policy_loss, reasonrl.algo.presets, reasonrl.algo.shaping, reasonrl.algo.value_loss\n"
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = [m for m in result.stdout.split() if m != "reasonrl" and m not in sys.stdlib_module_names]
    assert new == [], f"reasonrl.algo imports {new}; the math layer may import torch only"


def test_importing_the_trainer_starts_no_process_group_and_loads_no_ray():
    code = (
        "import sys\n"
        "import torch.distributed as dist\n"
        "import reasonrl, reasonrl.training.loop, reasonrl.training.placement.parallel, reasonrl.cli\n"
        "print('ray' in sys.modules, dist.is_initialized())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]
