"""``accel launch`` / ``accel config`` / ``accel env`` and the settings precedence.

Multi-process tests really start gloo jobs through ``accel launch``; every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rt_helpers import TIMEOUT_S, child_env
from runtime import settings
from runtime.launch import DEFAULT_MASTER_PORT, free_port

ACCEL = shutil.which("accel") or str(Path(sys.executable).with_name("accel"))

SCRIPT = """
import json, os, sys, time
from pathlib import Path
from runtime import Accelerator
kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
mode = sys.argv[3] if len(sys.argv) > 3 else "ok"
accelerator = Accelerator(**kwargs)
rank = accelerator.process_index
if mode == "raise" and rank == 1:
    time.sleep(0.5)
    raise ValueError("boom")
if mode == "hang" and rank == 1:
    time.sleep(60)
accelerator.wait_for_everyone()
Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "world": accelerator.num_processes,
    "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
    "timeout_s": accelerator.timeout.total_seconds(),
    "even_batches": accelerator.even_batches, "split_batches": accelerator.split_batches,
    "sources": accelerator.settings_sources,
    "gathered": accelerator.gather(__import__("torch").tensor([rank])).tolist(),
}))
accelerator.end_training()
"""


def accel(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None,
          timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([ACCEL, *args], cwd=cwd, env=env or child_env(), input=stdin,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"accel {args} hung for {timeout}s:\n{error.stdout}\n{error.stderr}")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in child_env().items() if not k.startswith("ACCEL_")}
    env["HOME"] = str(tmp_path / "home")  # never the real home's config
    env.pop("XDG_CACHE_HOME", None)
    return env


def results(out: Path, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_failing_rank_and_its_error_are_the_root_cause(tmp_path: Path, script: Path) -> None:
    start = time.monotonic()
    proc = accel("launch", "--nproc-per-node", "2", "--timeout", "30", str(script), str(tmp_path),
                 "{}", "raise", cwd=tmp_path, env=clean_env(tmp_path))
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < 30, f"the surviving rank was not stopped within the timeout ({elapsed:.0f}s)"
    root = proc.stderr.split("Root Cause")[1].split("=====")[0]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), root
    assert "ValueError: boom" in root and 'raise ValueError("boom")' in root  # the traceback
    assert "accel launch: rank 1 failed first: ValueError: boom" in proc.stderr


def test_collective_timeout_stops_a_waiting_rank(tmp_path: Path, script: Path) -> None:
    # Rank 1 hangs (no exception); rank 0 waits at a barrier and must give up after 3 s.
    start = time.monotonic()
    proc = accel("launch", "--nproc-per-node", "2", "--timeout", "3", str(script), str(tmp_path),
                 "{}", "hang", cwd=tmp_path, env=clean_env(tmp_path))
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < 40, elapsed
    root = proc.stderr.split("Root Cause")[1].split("=====")[0]
    assert re.search(r"rank\s*:\s*0", root), root
    assert "timed out" in root.lower() or "timeout" in root.lower(), root


def test_busy_default_port_is_replaced_by_a_free_one(tmp_path: Path, script: Path) -> None:
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            blocker.bind(("", DEFAULT_MASTER_PORT))
            blocker.listen()
        except OSError:
            pass  # already busy: just as good
        proc = accel("launch", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", str(script),
                     str(tmp_path), cwd=tmp_path, env=clean_env(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"port {DEFAULT_MASTER_PORT} is in use; using free port" in proc.stderr
        assert [r["gathered"] for r in results(tmp_path)] == [[0, 1], [0, 1]]
        # A busy port given explicitly is an error before anything starts.
        busy = accel("launch", "--master-addr", "127.0.0.1", "--master-port", str(DEFAULT_MASTER_PORT),
                      str(script), cwd=tmp_path, env=clean_env(tmp_path))
        assert busy.returncode == 2 and "already in use" in busy.stderr and "fix:" in busy.stderr
    finally:
        blocker.close()


def test_two_nodes_on_one_machine_form_one_world(tmp_path: Path, script: Path) -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [ACCEL, "launch", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
             "--master-addr", "127.0.0.1", "--master-port", port, str(script), str(tmp_path)],
            cwd=tmp_path, env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        for node in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT_S))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [(r["rank"], r["world"], r["gathered"]) for r in results(tmp_path)] == [
        (0, 2, [0, 1]), (1, 2, [0, 1])]


def test_launch_options_and_config_file_reach_the_accelerator(tmp_path: Path, script: Path) -> None:
    config = tmp_path / "cfg.yaml"
    settings.write_config_file(config, {"num_processes": 2, "gradient_accumulation_steps": 3,
                                        "timeout": 77, "even_batches": False, "split_batches": True})
    # The config's num_processes sets the process count; --gradient-accumulation-steps (env)
    # beats the config; the script's explicit split_batches=False beats everything.
    proc = accel("launch", "--config-file", str(config), "--gradient-accumulation-steps", "2",
                 str(script), str(tmp_path), json.dumps({"split_batches": False}),
                 cwd=tmp_path, env=clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in results(tmp_path):
        assert r["world"] == 2
        assert r["gradient_accumulation_steps"] == 2
        assert r["timeout_s"] == 77.0 and r["even_batches"] is False and r["split_batches"] is False
        assert r["sources"]["gradient_accumulation_steps"] == "ACCEL_GRADIENT_ACCUMULATION_STEPS"
        assert r["sources"]["timeout"].startswith("config file")
        assert r["sources"]["split_batches"] == "argument"
        assert r["sources"]["mixed_precision"] == "default"


def test_settings_precedence_and_errors(tmp_path: Path) -> None:
    config = settings.write_config_file(tmp_path / "c.yaml", {"mixed_precision": "bf16", "timeout": 5,
                                                              "use_cpu": True})
    env = {settings.CONFIG_FILE_ENV: str(config), "ACCEL_TIMEOUT": "9"}
    values, sources = settings.resolve({"cpu": False}, env)
    assert values["mixed_precision"] == "bf16" and sources["mixed_precision"].startswith("config file")
    assert values["timeout"] == 9.0 and sources["timeout"] == "ACCEL_TIMEOUT"
    assert values["cpu"] is False and sources["cpu"] == "argument"
    assert values["gradient_accumulation_steps"] == 1 and sources["gradient_accumulation_steps"] == "default"
    # Without ACCEL_CONFIG_FILE no config file is read (a plain `python train.py`).
    assert settings.resolve({}, {"HOME": str(tmp_path)})[0]["mixed_precision"] == "no"
    with pytest.raises(settings.SettingsError) as info:
        settings.resolve({}, {"ACCEL_MIXED_PRECISION": "fp8"})
    assert "ACCEL_MIXED_PRECISION" in str(info.value) and "fix:" in str(info.value)
    with pytest.raises(settings.SettingsError, match="does not exist"):
        settings.resolve({}, {settings.CONFIG_FILE_ENV: str(tmp_path / "missing.yaml")})


def test_strategy_setting_from_launch_env_and_config(tmp_path: Path) -> None:
    import argparse

    from runtime import launch

    parser = argparse.ArgumentParser()
    launch.add_launch_arguments(parser)
    args = parser.parse_args(["--strategy", "FSDP_zero2", "train.py"])
    assert launch.runtime_environment(args, None)["ACCEL_STRATEGY"] == "fsdp-zero2"
    config = settings.write_config_file(tmp_path / "c.yaml", {"strategy": "zero1"})
    values, sources = settings.resolve({}, {settings.CONFIG_FILE_ENV: str(config)})
    assert values["strategy"] == "zero1" and sources["strategy"].startswith("config file")
    values, sources = settings.resolve({"strategy": "ddp"}, {"ACCEL_STRATEGY": "fsdp"})
    assert (values["strategy"], sources["strategy"]) == ("ddp", "argument")
    assert settings.resolve({}, {})[0]["strategy"] == "ddp"
    with pytest.raises(settings.SettingsError, match="ACCEL_STRATEGY.*zero4"):
        settings.resolve({}, {"ACCEL_STRATEGY": "zero4"})


def test_accel_config_default_and_interactive_then_env(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    proc = accel("config", "--default", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    default_path = tmp_path / "home" / ".cache" / "accel" / "default_config.yaml"
    assert settings.read_config_file(default_path) == {
        "use_cpu": False, "num_processes": 1, "num_machines": 1, "mixed_precision": "no",
        "gradient_accumulation_steps": 1, "strategy": "ddp", "timeout": 1800.0}
    target = tmp_path / "asked.yaml"
    # Answers: cpu yes, 2 processes, 1 machine, an invalid then a valid precision, 4 steps,
    # an invalid then a valid strategy, default rest.
    proc = accel("config", "--config-file", str(target), cwd=tmp_path, env=env,
                 stdin="yes\n2\n\nfp8\nbf16\n4\nzero9\nfsdp-zero2\n\n")
    assert proc.returncode == 0, proc.stderr
    assert "invalid answer 'fp8'" in proc.stdout and "invalid answer 'zero9'" in proc.stdout
    assert settings.read_config_file(target) == {
        "use_cpu": True, "num_processes": 2, "num_machines": 1, "mixed_precision": "bf16",
        "gradient_accumulation_steps": 4, "strategy": "fsdp-zero2", "timeout": 1800.0}
    report = accel("env", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    for needle in ("accel-migrate version", "Python version", "PyTorch version", "CPU count",
                   "CUDA devices", str(default_path), "mixed_precision: no"):
        assert needle in report.stdout, needle


def test_help_describes_every_option(tmp_path: Path) -> None:
    top = accel("--help", cwd=tmp_path)
    assert all(cmd in top.stdout for cmd in ("launch", "config", "env"))
    launch = accel("launch", "--help", cwd=tmp_path)
    for option in ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-backend",
                   "--rdzv-id", "--master-addr", "--master-port", "--max-restarts", "--module",
                   "--mixed-precision", "--gradient-accumulation-steps", "--cpu", "--timeout",
                   "--config-file"):
        assert option in launch.stdout, option
    config = accel("config", "--help", cwd=tmp_path)
    assert "--default" in config.stdout and "--config-file" in config.stdout
