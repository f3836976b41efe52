"""Experiment trackers with Accelerate's API: ``log_with``, ``init_trackers``, ``log``, ``end_training``.

``Accelerator(log_with=..., project_dir=...)`` names the trackers ("all", a name, a list of names
and/or tracker objects); ``init_trackers(project_name, config, init_kwargs)`` starts them,
``log(values, step)`` writes to each, ``get_tracker(name)`` returns one and ``end_training()``
(or the interpreter's exit) closes them.

Who writes: the main process only. On every other process ``init_trackers`` starts nothing,
``log`` does nothing, ``trackers`` is empty and ``get_tracker`` returns a tracker whose every
method (and, with ``unwrap=True``, every attribute of the "library object") is a no-op, so the
same script runs on every rank without ``if accelerator.is_main_process:``. A tracker object
passed in ``log_with`` whose ``main_process_only`` is False runs on every process (as in
Accelerate).

Built-in kinds (``TRACKERS``):
- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` in ``<logging_dir>/<project_name>``;
  the config is recorded as hparams in that same event file.
- ``jsonl``: no dependency; ``<logging_dir>/<project_name>/metrics.jsonl`` gets one JSON object per
  ``log`` call, ``{"step": ..., "time": <unix time>, "values": {...}}``, and ``config.json`` the
  config.
- ``wandb``: ``wandb.init(project=project_name, **init_kwargs["wandb"])`` (``mode="offline"``
  works without a network).
- ``mlflow``: experiment ``project_name``, one run; the tracking store is mlflow's own setting
  (``MLFLOW_TRACKING_URI``, e.g. ``file:./mlruns``).
A kind whose package is missing raises ``TrackerError`` naming the pip package when the
Accelerator is created (Accelerate drops it silently; a run that logs nothing is found too late).
"all" means every kind whose package is installed.

Throughput (the idea of Lightning's ThroughputMonitor, without its window): ``log(values,
samples=n, tokens=m)`` adds ``throughput/samples_per_sec`` and ``throughput/tokens_per_sec``:
the counts given since the previous call with counts (this call's included), divided by the
seconds since that call (or since ``init_trackers`` for the first), times the number of
processes; ``throughput/device/...`` is the same for one process. The counts are what this
process handled; every process is assumed to handle as many (prepared loaders with even batches
do), so no collective runs inside ``log``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .errors import AccelError


class TrackerError(AccelError, ValueError):
    """A tracker that cannot be created or used as asked."""


def _plain(value: Any) -> Any:
    """Tensors (and nested dicts/lists of them) as Python numbers and lists, as Accelerate logs them."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    tolist = getattr(value, "tolist", None)  # torch.Tensor and numpy values
    if callable(tolist) and not isinstance(value, (str, bytes)):
        size = getattr(value, "size", None)
        one = value.numel() == 1 if callable(getattr(value, "numel", None)) else size == 1
        return value.item() if one else tolist()  # a 1-element tensor is a scalar
    return value


class GeneralTracker:
    """Base class of every tracker: subclass it to pass your own in ``log_with``.

    A tracker has a ``name`` (the key of ``init_kwargs`` / ``log_kwargs`` and of ``get_tracker``),
    ``tracker`` (the library object, what ``get_tracker(name, unwrap=True)`` returns),
    ``store_init_configuration(values)``, ``log(values, step, **kwargs)`` and ``finish()``.
    """

    name: str = "general"
    requires_logging_directory: bool = False
    main_process_only: bool = True
    package: str | None = None  # pip package the kind needs (None: none)
    # Built-in trackers finish once: `get_tracker(name).finish()` in the script, then
    # `end_training()` or the exit, must not end a wandb run or an mlflow run twice.
    finished: bool = False

    @property
    def tracker(self) -> Any:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        pass

    def finish(self) -> None:
        pass


class _Nothing:
    """Every attribute and every call of it is itself: a library object that does nothing."""

    def __getattr__(self, name: str) -> "_Nothing":
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> "_Nothing":
        return self

    def __bool__(self) -> bool:
        return False


class NoOpTracker(GeneralTracker):
    """What ``get_tracker`` returns on a process that does not write (not the main process)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def tracker(self) -> Any:
        return _Nothing()


class TensorBoardTracker(GeneralTracker):
    """``SummaryWriter(<logging_dir>/<run_name>, **kwargs)``; the config as hparams in the same file."""

    name = "tensorboard"
    requires_logging_directory = True
    package = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer = SummaryWriter(self.logging_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # add_hparams would open a second event file in a timestamped subdirectory; the hparams
        # summaries go to this run's own file instead, so one directory is one run.
        config = {key: _hparam(value) for key, value in _plain(values).items()}
        file_writer = self.writer._get_file_writer()
        for summary in hparams(config, {}):
            file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in _plain(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                warnings.warn(
                    f"tensorboard tracker: {key!r} is a {type(value).__name__}, not a number, text or "
                    "dict of numbers; it was not logged (log it through "
                    "accelerator.get_tracker('tensorboard', unwrap=True), a SummaryWriter).",
                    stacklevel=3,
                )
        self.writer.flush()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.writer.close()


def _hparam(value: Any) -> Any:
    """TensorBoard's hparams take numbers, text and booleans; anything else is recorded as text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class JSONLTracker(GeneralTracker):
    """``<logging_dir>/<run_name>/metrics.jsonl``: one JSON object per ``log`` call; no dependency.

    Each line is ``{"step": <step or null>, "time": <unix time>, "values": {...}}``; a resumed run
    appends to the same file. The config goes to ``config.json`` beside it.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str]) -> None:
        self.run_name = run_name
        self.logging_dir = Path(logging_dir) / run_name
        self.logging_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.logging_dir / "metrics.jsonl"
        self.file = open(self.path, "a", encoding="utf-8")

    @property
    def tracker(self) -> Any:
        return self.file

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        text = json.dumps(_plain(values), indent=2, default=str)
        (self.logging_dir / "config.json").write_text(text + "\n", encoding="utf-8")

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, "time": time.time(), "values": _plain(values)}
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()  # a crashed run keeps every line logged before the crash

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.file.close()


class WandBTracker(GeneralTracker):
    """``wandb.init(project=run_name, **kwargs)``; ``log`` is ``run.log(values, step=step)``."""

    name = "wandb"
    package = "wandb"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        import wandb

        self.run_name = run_name
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(_plain(values), allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(_plain(values), step=step, **kwargs)

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.run.finish()


class MLflowTracker(GeneralTracker):
    """One mlflow run in experiment ``experiment_name`` (created if missing); numbers are logged as
    metrics, the config as params. ``kwargs`` go to ``mlflow.start_run`` (``run_name``, ``tags``, ...)."""

    name = "mlflow"
    package = "mlflow"

    def __init__(self, experiment_name: str, **kwargs: Any) -> None:
        import mlflow

        self.mlflow = mlflow
        experiment = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name))
        self.active_run = mlflow.start_run(experiment_id=experiment.experiment_id, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.mlflow.log_params({key: str(value) for key, value in _plain(values).items()})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {
            key: float(value)
            for key, value in _plain(values).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        self.mlflow.log_metrics(metrics, step=step, **kwargs)

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.mlflow.end_run()


TRACKERS: dict[str, type[GeneralTracker]] = {
    tracker.name: tracker for tracker in (TensorBoardTracker, JSONLTracker, WandBTracker, MLflowTracker)
}
"""Every built-in tracker kind, by the name ``log_with`` uses."""


def is_available(name: str) -> bool:
    """Whether the package the kind needs is installed (without importing it)."""
    package = TRACKERS[name].package
    return package is None or find_spec(package) is not None


def available_trackers() -> list[str]:
    """The kinds ``log_with="all"`` starts: those whose package is installed."""
    return [name for name in TRACKERS if is_available(name)]


def _requested(log_with: Any) -> list[str | GeneralTracker]:
    """``log_with`` as a list of kind names and tracker objects, checked (unknown or missing kinds raise)."""
    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    requested: list[str | GeneralTracker] = []
    for item in items:
        if not isinstance(item, str):
            name = getattr(item, "name", None)
            missing = [m for m in ("log", "store_init_configuration", "finish") if not callable(getattr(item, m, None))]
            if not isinstance(name, str) or missing:
                raise TrackerError(
                    f"log_with got {item!r}, which is neither a tracker name nor a tracker object.",
                    f"one of {sorted(TRACKERS)} or 'all', or an object with a name and "
                    "log/store_init_configuration/finish methods.",
                    "pass a name, or subclass runtime.tracking.GeneralTracker.",
                )
            requested.append(item)
            continue
        name = str(getattr(item, "value", item)).lower()  # an enum member such as LoggerType.TENSORBOARD
        kinds = available_trackers() if name == "all" else [name]
        for kind in kinds:
            if kind not in TRACKERS:
                raise TrackerError(
                    f"log_with={item!r} is not a tracker kind this runtime knows.",
                    f"one of {sorted(TRACKERS)}, 'all', or a tracker object.",
                    "fix the name, or pass your own runtime.tracking.GeneralTracker subclass.",
                )
            if not is_available(kind):
                package = TRACKERS[kind].package
                raise TrackerError(
                    f"log_with asks for the {kind} tracker, but the {package!r} package is not installed.",
                    f"{package} importable in this environment.",
                    f"pip install {package}  (or log with 'jsonl', which needs nothing).",
                )
            if kind not in requested:
                requested.append(kind)
    return requested


class Tracking:
    """The Accelerator's trackers: which were asked for, which run here, and throughput timing."""

    def __init__(self, log_with: Any, logging_dir: Callable[[], str | None], is_main_process: bool) -> None:
        self.requested = _requested(log_with)
        self._logging_dir = logging_dir
        self.is_main_process = is_main_process
        self.trackers: list[GeneralTracker] = []
        self.started = False
        self._counts = {"samples": 0.0, "tokens": 0.0}
        self._since = time.perf_counter()
        self._warned_unstarted = False
        for kind in self.requested:
            if isinstance(kind, str) and TRACKERS[kind].requires_logging_directory and logging_dir() is None:
                raise TrackerError(
                    f"log_with={kind!r} writes files, but the Accelerator has no project_dir.",
                    "Accelerator(log_with=..., project_dir='some/dir'): the logs go to some/dir/<project_name>.",
                    "pass project_dir= (or ProjectConfiguration(logging_dir=...)) to Accelerator.",
                )

    def _runs_here(self, tracker: str | GeneralTracker) -> bool:
        if isinstance(tracker, str):
            return self.is_main_process
        return self.is_main_process or not getattr(tracker, "main_process_only", True)

    def init(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, dict[str, Any]] | None) -> None:
        if self.started:
            raise TrackerError(
                "init_trackers() was called a second time.",
                "one init_trackers(project_name, ...) per Accelerator.",
                "call it once, before the first accelerator.log(...).",
            )
        init_kwargs = init_kwargs or {}
        unknown = sorted(set(init_kwargs) - {self._name(t) for t in self.requested})
        if unknown:
            raise TrackerError(
                f"init_kwargs has keys {unknown} that are not among the trackers of log_with.",
                f"keys among {[self._name(t) for t in self.requested]}.",
                "key init_kwargs by tracker name, e.g. init_kwargs={'wandb': {'mode': 'offline'}}.",
            )
        self.started = True
        for kind in self.requested:
            if not self._runs_here(kind):
                continue
            if isinstance(kind, str):
                cls = TRACKERS[kind]
                kwargs = init_kwargs.get(kind, {})
                if cls.requires_logging_directory:
                    tracker = cls(project_name, self._logging_dir(), **kwargs)  # type: ignore[call-arg]
                else:
                    tracker = cls(project_name, **kwargs)  # type: ignore[call-arg]
            else:
                tracker = kind
                start = getattr(tracker, "start", None)
                if callable(start):
                    start()
            self.trackers.append(tracker)
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)
        if self.trackers:
            atexit.register(self.finish)  # files are closed even without end_training()
        self._since = time.perf_counter()

    @staticmethod
    def _name(tracker: str | GeneralTracker) -> str:
        return tracker if isinstance(tracker, str) else tracker.name

    def log(
        self,
        values: dict[str, Any],
        step: int | None,
        log_kwargs: dict[str, dict[str, Any]] | None,
        num_processes: int,
        samples: float | None = None,
        tokens: float | None = None,
    ) -> None:
        if samples is not None or tokens is not None:
            values = {**values, **self._throughput(samples, tokens, num_processes)}
        if not self.started:
            if self.requested and self.is_main_process:
                raise TrackerError(
                    "accelerator.log() was called before accelerator.init_trackers().",
                    "init_trackers(project_name) once, before the first log.",
                    "call accelerator.init_trackers('my_project', config=...) after creating the Accelerator.",
                )
            if not self.requested and not self._warned_unstarted and self.is_main_process:
                self._warned_unstarted = True
                warnings.warn(
                    "accelerator.log() has no tracker to write to: pass log_with= to Accelerator "
                    "(e.g. log_with='jsonl', project_dir='runs') and call init_trackers().",
                    stacklevel=3,
                )
            return
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def _throughput(self, samples: float | None, tokens: float | None, num_processes: int) -> dict[str, float]:
        for key, count in (("samples", samples), ("tokens", tokens)):
            if count is not None:
                if not isinstance(count, (int, float)) or isinstance(count, bool) or count < 0 or math.isnan(count):
                    raise TrackerError(
                        f"accelerator.log(..., {key}={count!r}): not a count.",
                        f"{key}= a number >= 0: how many this process handled since the previous call.",
                        f"pass e.g. {key}=len(batch) (an int).",
                    )
                self._counts[key] += count
        now = time.perf_counter()
        elapsed = now - self._since
        rates: dict[str, float] = {}
        if elapsed > 0:
            for key, count in (("samples", samples), ("tokens", tokens)):
                if count is not None:
                    per_device = self._counts[key] / elapsed
                    rates[f"throughput/{key}_per_sec"] = per_device * num_processes
                    rates[f"throughput/device/{key}_per_sec"] = per_device
        self._counts = {"samples": 0.0, "tokens": 0.0}
        self._since = now
        return rates

    def get(self, name: str, unwrap: bool) -> Any:
        names = [self._name(t) for t in self.requested]
        if name not in names:
            raise TrackerError(
                f"get_tracker({name!r}): no such tracker in log_with.",
                f"one of {names}" if names else "a tracker named in Accelerator(log_with=...).",
                f"add {name!r} to log_with, or ask for one of those.",
            )
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if self.is_main_process and not self.started:
            raise TrackerError(
                f"get_tracker({name!r}) was called before init_trackers().",
                "init_trackers(project_name) first.",
                "call accelerator.init_trackers(...) before get_tracker.",
            )
        no_op = NoOpTracker(name)  # this process does not write
        return no_op.tracker if unwrap else no_op

    def finish(self) -> None:
        """Close every tracker once (``end_training`` and the interpreter's exit both call it)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()
        if trackers:
            atexit.unregister(self.finish)
