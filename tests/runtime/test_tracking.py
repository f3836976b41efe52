"""Experiment trackers (runtime/tracking.py) on 2 gloo processes, and their errors on one.

workers/trackers.py logs 4 steps with tensorboard and jsonl (and mlflow in a ``file:`` store when
mlflow is installed; mlflow is not in the test extra, being heavy, so that part skips without it).
Each rank logs its own value, so a value from rank 1 in a file would show that it wrote. Read back:
the jsonl lines, the TensorBoard event file (tensorboard's EventAccumulator) with the config as
hparams, the mlflow metric files.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rt_helpers import run_worker_once

HAVE_MLFLOW = importlib.util.find_spec("mlflow") is not None
LOSSES = [1.0 / (step + 1) for step in range(4)]  # rank 0's; rank 1 logs 10 more


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    root = tmp_path_factory.mktemp("trackers")
    ranks, _ = run_worker_once("trackers", root)
    return ranks, root / "trackers"


def test_only_the_main_process_has_trackers_and_end_training_closes_them(run) -> None:
    (main, other), _ = run
    assert main["trackers"][:2] == ["tensorboard", "jsonl"]
    assert main["tensorboard_unwrapped"] == "SummaryWriter" and main["jsonl_tracker"] == "JSONLTracker"
    assert main["jsonl_closed"] and main["tensorboard_closed"] and main["trackers_after_end"] == []
    assert other == {"trackers": [], "tensorboard_unwrapped": "_Nothing", "jsonl_tracker": "NoOpTracker"}


def test_jsonl_has_one_line_per_log_call_of_rank_0(run) -> None:
    _, out = run
    run_dir = out / "proj" / "exp"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    assert [line["values"]["loss"] for line in lines] == pytest.approx(LOSSES)
    assert {line["values"]["rank"] for line in lines} == {0}
    assert all(line["values"]["throughput/samples_per_sec"] > 0 for line in lines)
    # 4 samples per process, 2 processes: the job's rate is twice one process's.
    assert all(
        line["values"]["throughput/samples_per_sec"] == pytest.approx(2 * line["values"]["throughput/device/samples_per_sec"])
        for line in lines
    )
    times = [line["time"] for line in lines]
    assert times == sorted(times)
    assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.5, "batch_size": 4, "optimizer": "sgd"}


def test_tensorboard_event_file_holds_rank_0_scalars_and_config(run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _, out = run
    run_dir = out / "proj" / "exp"
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # one writer: rank 0's
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (step, pytest.approx(loss)) for step, loss in enumerate(LOSSES)
    ]
    assert [e.value for e in events.Scalars("rank")] == [0, 0, 0, 0]
    assert [e.value for e in events.Scalars("on_every_rank")] == [1.0]
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["lr"].number_value == 0.5 and hparams["batch_size"].number_value == 4
    assert hparams["optimizer"].string_value == "sgd"


@pytest.mark.skipif(not HAVE_MLFLOW, reason="mlflow is not installed (not in the test extra: it is heavy)")
def test_mlflow_file_store_holds_rank_0_metrics_and_params(run) -> None:
    _, out = run
    runs = [p for p in (out / "mlruns").glob("*/*") if (p / "metrics").is_dir()]
    assert len(runs) == 1  # one run: rank 0's
    rows = (runs[0] / "metrics" / "loss").read_text().split("\n")
    values = [(int(r.split()[2]), float(r.split()[1])) for r in rows if r.strip()]
    assert values == [(step, pytest.approx(loss)) for step, loss in enumerate(LOSSES)]
    assert (runs[0] / "params" / "lr").read_text() == "0.5"


def test_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import Accelerator
    from runtime import tracking
    from runtime.tracking import TrackerError

    with pytest.raises(TrackerError, match="no project_dir"):
        Accelerator(cpu=True, log_with="jsonl")
    with pytest.raises(TrackerError, match="not a tracker kind"):
        Accelerator(cpu=True, log_with="tensorbord", project_dir=tmp_path)
    monkeypatch.setattr(tracking, "find_spec", lambda name: None)
    with pytest.raises(TrackerError, match="pip install wandb"):
        Accelerator(cpu=True, log_with=["jsonl", "wandb"], project_dir=tmp_path)
    assert tracking.available_trackers() == ["jsonl"]  # what "all" starts without any package
    monkeypatch.undo()
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    with pytest.raises(TrackerError, match="before accelerator.init_trackers"):
        accelerator.log({"loss": 1.0})
    with pytest.raises(TrackerError, match="init_kwargs has keys"):
        accelerator.init_trackers("exp", init_kwargs={"wandb": {}})
    accelerator.init_trackers("exp")
    with pytest.raises(TrackerError, match="no such tracker"):
        accelerator.get_tracker("wandb")
    with pytest.raises(TrackerError, match="samples="):
        accelerator.log({"loss": 1.0}, samples=-1)
    accelerator.end_training()


def test_a_tracker_object_in_log_with_gets_config_values_and_finish(tmp_path: Path) -> None:
    from runtime import Accelerator
    from runtime.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name = "recorder"

        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def start(self) -> None:
            self.calls.append(("start",))

        def store_init_configuration(self, values: dict) -> None:
            self.calls.append(("config", values))

        def log(self, values: dict, step: int | None = None, **kwargs) -> None:
            self.calls.append(("log", values, step, kwargs))

        def finish(self) -> None:
            self.calls.append(("finish",))

    import torch

    recorder = Recorder()
    accelerator = Accelerator(cpu=True, log_with=[recorder, "jsonl"], project_dir=tmp_path)
    accelerator.init_trackers("exp", config={"lr": 0.1})
    loss = torch.tensor([0.5])
    accelerator.log({"loss": loss}, step=2, log_kwargs={"recorder": {"tag": "x"}})
    assert accelerator.get_tracker("recorder") is recorder
    assert [t.name for t in accelerator.trackers] == ["recorder", "jsonl"]
    accelerator.end_training()
    # A tracker of your own gets the values as given (tensors too), as in Accelerate.
    assert recorder.calls == [("start",), ("config", {"lr": 0.1}), ("log", {"loss": loss}, 2, {"tag": "x"}), ("finish",)]
    assert recorder.calls[2][1]["loss"] is loss
    line = json.loads((tmp_path / "exp" / "metrics.jsonl").read_text())
    assert line["step"] == 2 and line["values"] == {"loss": 0.5}  # a 1-element tensor: a number
