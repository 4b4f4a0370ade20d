"""The GPU checks on a machine without a network: install the wheelhouse, name the device, run the GPU tests
and the GPU benchmark, each within its time budget, and write every result as JSON.

    scripts/gpu-check.sh OUT          (= python3 scripts/gpu_check.py run OUT)

Steps, in order (each a child process, stopped with its process group when its budget runs out; a failed
step does not stop the ones after it, so one lease brings back every result):

1. ``install``: the wheels of ``.whl/`` (scripts/wheelhouse.sh) with pip ``--no-index --no-deps --target``
   into a folder made for this run (``tempfile``: new, the user's own and private, removed at the end; never
   a fixed shared path such as /tmp/reasonrl-site, where another user could plant a ``sitecustomize.py``
   that every step would run); that folder and the repository go first on the children's PYTHONPATH, the
   image's own packages (CUDA torch, transformers, peft) stay where they are.
2. ``device``: OUT/device.json, the card's name and memory (nvidia-smi, torch) and the versions used.
3. ``requirements``: every requirement of reasonrl (pyproject.toml) and of each installed wheel is
   importable at a version it accepts; the unmet ones are named.
4. ``pytest``: ``pytest -m gpu``, its results per test in OUT/pytest.json (from its JUnit XML), its output
   in OUT/pytest.log.
5. the benchmarks (``--benchmarks``, or the environment variable GPU_CHECK_BENCHMARKS; default all), each
   where its file exists (skipped with a note where it does not), its results under OUT/NAME, its output in
   OUT/NAME.log:
   - ``gpu_rollout``: ``bench/gpu_rollout.py --profile gpu``, generation without vLLM (transformers' ``generate``
     against its continuous batching, the paged engine's) on the 0.5B and 1.5B shapes at batches 16, 64 and
     256, within 240 s;
   - ``gpu_rl_step``: ``bench/gpu_rl_step.py --profile gpu``, a whole dapo step on a random-weight Qwen2.5-1.5B
     at a 4k cap, reasonrl (paged engine) against TRL's GRPOTrainer paged and with ``generate``, within 420 s;
   - ``async_rl``: ``bench/async_rl.py --profile gpu``, synchronous against one-step-off rollouts and T-PPO on a
     random-weight Qwen2.5-1.5B, 4 steps each, within 540 s (sync and async1 took about 350 s on an H200);
   - ``train_side``: ``bench/train_side.py --profile gpu``, within what is left of the budget.
   Every step finds its own limit in seconds in the environment variable GPU_CHECK_STEP_SECONDS.

OUT/gpu_check.json holds the device and each step's status (passed, failed, timed_out, skipped), exit
code, seconds and note; it is rewritten after every step, so a run stopped from outside still leaves it.
The whole run keeps within ``--budget`` seconds (default 480: 8 minutes on one H100; all benchmarks whole need
more than one lent command: pick them with ``--benchmarks``); the exit code is 0
when no step failed or timed out.  Only the Python standard library is imported before the install.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESERVE_SECONDS = 5  # kept back from every step for writing the results after it
MIN_STEP_SECONDS = 10  # a step that would get less is skipped, not started
STEP_BUDGETS = {
    "install": 60,
    "device": 60,
    "requirements": 60,
    "pytest": 150,
    "gpu_rollout": 240,
    "gpu_rl_step": 420,
    "async_rl": 540,
}
"""Each step's limit in seconds; a step not listed gets what is left of the run's budget."""
# the benchmarks, in the order they run, and their arguments given the folder of their results
BENCHMARKS = {
    "gpu_rollout": lambda out: ["--profile", "gpu", "--out", str(out)],
    "gpu_rl_step": lambda out: ["--profile", "gpu", "--out", str(out)],
    "async_rl": lambda out: ["--profile", "gpu", "--variants", "sync", "async1", "t_ppo", "--seeds", "0",
                             "--out", str(out / "async_rl_gpu.json"), "train.rollout_steps=4"],
    "train_side": lambda out: ["--profile", "gpu", "--out", str(out)],
}  # fmt: skip
MESSAGE_CHARS = 4000
# a module that fails to import (a package missing on the image) is reported, and the other tests still run
PYTEST_OPTIONS = ["-q", "-rs", "-p", "no:cacheprovider", "--continue-on-collection-errors"]


def device_info() -> dict:
    """The machine's accelerator as nvidia-smi and torch see it, and the versions of what the checks run on."""
    info: dict = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    info["python"] = platform.python_version()
    info["nvidia_smi"] = nvidia_smi_gpus()
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        info["torch_device_name"] = torch.cuda.get_device_name(0) if info["cuda_available"] else None
    except Exception as error:  # a broken torch is itself a result worth bringing back
        info["torch_error"] = repr(error)
        info["cuda_available"] = False
        info["torch_device_name"] = None
    for package in ("transformers", "peft", "accelerate", "trl"):
        info[package] = installed_version(package)
    gpus = info["nvidia_smi"] or []
    info["device"] = info["torch_device_name"] or (gpus[0]["name"] if gpus else f"cpu ({platform.machine()})")
    return info


def nvidia_smi_gpus() -> list[dict] | None:
    """Name, memory and driver of each GPU nvidia-smi lists; None where there is no nvidia-smi or it fails."""
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in done.stdout.strip().splitlines():
        name, memory, driver = (field.strip() for field in line.split(","))
        gpus.append({"name": name, "memory_total_mib": int(memory), "driver": driver})
    return gpus


def installed_version(package: str) -> str | None:
    """The installed version of distribution ``package``, None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def unmet_requirements(requirements: list[str]) -> list[str]:
    """Each of ``requirements`` (PEP 508 strings) that applies here and is missing or at a version it refuses."""
    from packaging.requirements import Requirement

    unmet = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        version = installed_version(requirement.name)
        if version is None:
            unmet.append(f"{requirement.name}: not installed (wanted {requirement.specifier or 'any version'})")
        elif not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{requirement.name}: {version} installed, {requirement.specifier} wanted")
    return unmet


def project_and_wheel_requirements(site: Path) -> list[str]:
    """reasonrl's runtime requirements (pyproject.toml) and those of every distribution installed in ``site``."""
    import tomllib
    from importlib import metadata

    requirements = list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    for distribution in metadata.distributions(path=[str(site)]):
        requirements.extend(distribution.requires or [])
    return requirements


def junit_results(junit_xml: Path) -> dict:
    """pytest's JUnit XML as JSON: one record per test (id, outcome, seconds, message) and the counts."""
    tests = []
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (found.get("message") or "") + ("\n" + found.text if found.text and tag != "skipped" else "")
                break
        test = {"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome}
        test["seconds"] = float(case.get("time") or 0)
        if message:
            test["message"] = message[-MESSAGE_CHARS:]
        tests.append(test)
    counts = {outcome: 0 for outcome in ("passed", "failed", "error", "skipped")}
    for test in tests:
        counts[test["outcome"]] += 1
    return {"counts": counts, "tests": tests}


class Check:
    """One run of the steps under a shared deadline, its record kept in OUT/gpu_check.json."""

    def __init__(self, out: Path, site: Path, wheelhouse: Path, budget: float,
                 benchmarks: list[str] | None = None) -> None:  # fmt: skip
        self.out, self.site, self.wheelhouse = out, site, wheelhouse
        self.benchmarks = list(BENCHMARKS) if benchmarks is None else benchmarks
        self.started = time.monotonic()
        self.deadline = self.started + budget
        self.record: dict = {"device": None, "budget_seconds": budget, "steps": []}
        self.child: subprocess.Popen | None = None
        paths = [str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", PIP_NO_INDEX="1")

    def say(self, text: str) -> None:
        print(f"[gpu-check {time.monotonic() - self.started:5.0f}s] {text}", flush=True)

    def step(self, name: str, command: list[str], log: Path | None = None, budget: float | None = None) -> dict:
        """Run ``command`` within ``budget`` seconds (capped by the deadline); its output goes to ``log`` and,
        line by line, to this process's output."""
        seconds_left = self.deadline - time.monotonic() - RESERVE_SECONDS
        if seconds_left < MIN_STEP_SECONDS:
            return self.skip(name, f"no time left: {seconds_left:.0f} s of the budget remained")
        timeout = min(budget or seconds_left, seconds_left)
        shown = " ".join(command)
        self.say(f"{name}: {shown if len(shown) <= 160 else shown[:160] + ' …'} (at most {timeout:.0f} s)")
        start = time.monotonic()
        env = dict(self.env, GPU_CHECK_STEP_SECONDS=str(int(timeout)))  # a benchmark may size its work to it
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, errors="replace", process_group=0)  # fmt: skip
        self.child = child
        lines: list[str] = []
        reader = threading.Thread(target=copy_lines, args=(child.stdout, lines, log), daemon=True)
        reader.start()
        try:
            child.wait(timeout=timeout)
            status = "passed" if child.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the step's own children (workers, compilers) too
            child.wait()
            status = "timed_out"
        self.child = None
        reader.join(timeout=10)
        result = {"name": name, "status": status, "returncode": child.returncode}
        result["seconds"] = round(time.monotonic() - start, 1)
        if status != "passed":
            result["note"] = "".join(lines[-40:])[-MESSAGE_CHARS:]
        return self.done(result)

    def skip(self, name: str, note: str) -> dict:
        return self.done({"name": name, "status": "skipped", "returncode": None, "seconds": 0.0, "note": note})

    def done(self, result: dict) -> dict:
        self.say(f"{result['name']}: {result['status']} ({result['seconds']} s)")
        self.record["steps"].append(result)
        self.write("gpu_check.json", self.record)
        return result

    def write(self, name: str, content: dict) -> None:
        (self.out / name).write_text(json.dumps(content, indent=2) + "\n")

    def stop(self, signal_number: int, _frame) -> None:
        """On Ctrl-C or a kill from outside, stop the running step's processes too: their own process group
        does not get the terminal's signals."""
        if self.child is not None and self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGKILL)
        raise SystemExit(128 + signal_number)

    def run(self) -> int:
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signal_number, self.stop)
        python = sys.executable
        self.install(python)
        script = str(Path(__file__).resolve())
        self.step("device", [python, script, "device", str(self.out / "device.json")], budget=STEP_BUDGETS["device"])
        device_file = self.out / "device.json"
        self.record["device"] = json.loads(device_file.read_text())["device"] if device_file.exists() else None
        requirements = [python, script, "requirements", str(self.site)]
        self.step("requirements", requirements, budget=STEP_BUDGETS["requirements"])
        self.run_tests(python)
        self.run_benchmarks(python, self.benchmarks)
        self.record["seconds"] = round(time.monotonic() - self.started, 1)
        self.write("gpu_check.json", self.record)
        return int(any(step["status"] in ("failed", "timed_out") for step in self.record["steps"]))

    def install(self, python: str) -> None:
        wheels = sorted(str(wheel) for wheel in self.wheelhouse.glob("*.whl"))
        if not wheels:
            self.skip("install", f"no wheels in {self.wheelhouse}: run scripts/wheelhouse.sh where pip has an index")
            return
        pip = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
        self.step("install", [*pip, "--upgrade", "--target", str(self.site), *wheels], budget=STEP_BUDGETS["install"])

    def run_tests(self, python: str) -> None:
        junit = self.out / "junit.xml"
        pytest = [python, "-m", "pytest", "-m", "gpu", *PYTEST_OPTIONS, f"--junitxml={junit}"]
        self.step("pytest", pytest, log=self.out / "pytest.log", budget=STEP_BUDGETS["pytest"])
        if junit.exists():
            self.write("pytest.json", {"device": self.record["device"], **junit_results(junit)})
            junit.unlink()

    def run_benchmarks(self, python: str, names: list[str]) -> None:
        for name in names:
            benchmark = ROOT / "bench" / f"{name}.py"
            if not benchmark.exists():
                self.skip(name, f"bench/{name}.py is not in this tree: no {name} benchmark run")
                continue
            command = [python, str(benchmark), *BENCHMARKS[name](self.out / name)]
            self.step(name, command, log=self.out / f"{name}.log", budget=STEP_BUDGETS.get(name))


def copy_lines(stream, lines: list[str], log: Path | None) -> None:
    """Copy ``stream`` line by line to this process's output, to ``lines`` and to ``log`` (if any)."""
    with open(log or os.devnull, "w") as sink:
        for line in stream:
            sys.stdout.write(line)
            sink.write(line)
            sink.flush()
            lines.append(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="every step; results under OUT")
    run.add_argument("out", type=Path)
    run.add_argument("--wheelhouse", type=Path, default=ROOT / ".whl")
    run.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET_S", 480)))
    chosen = os.environ.get("GPU_CHECK_BENCHMARKS")
    run.add_argument("--benchmarks", nargs="*", choices=list(BENCHMARKS), default=chosen.split() if chosen else None,
                     help="the benchmarks to run, in this order (default: all; env GPU_CHECK_BENCHMARKS)")  # fmt: skip
    device = commands.add_parser("device", help="write the device's description as JSON")
    device.add_argument("path", type=Path)
    requirements = commands.add_parser("requirements", help="name unmet requirements of reasonrl and the wheels")
    requirements.add_argument("site", type=Path)
    args = parser.parse_args(argv)

    if args.command == "device":
        info = device_info()
        args.path.write_text(json.dumps(info, indent=2) + "\n")
        print(json.dumps(info, indent=2))
        return 0
    if args.command == "requirements":
        unmet = unmet_requirements(project_and_wheel_requirements(args.site))
        print("\n".join(unmet) if unmet else "every requirement of reasonrl and of the installed wheels is met")
        return int(bool(unmet))
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="reasonrl-site-") as site:  # mode 0700, removed on any exit but a kill
        return Check(args.out.resolve(), Path(site), args.wheelhouse.resolve(), args.budget, args.benchmarks).run()


if __name__ == "__main__":
    sys.exit(main())
