"""`accel-migrate rules`, `accel-migrate explain CODE` and `accel-migrate verify SCRIPT [-- ARGS]`.

Kept out of migrate.cli so that `accel-migrate --version`, `--help` and a plain run never build
these commands (the verify command's help comes from migrate.verify); migrate.cli.main() imports
this module only when the first argument names a subcommand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from migrate.cli import EXIT_FAILED, ReadableHelp, _fail_usage, _rule_table

commands = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


@commands.command("rules", cls=ReadableHelp, help="List the rules: code, name and what each does.")
def rules_command() -> None:
    rows = _rule_table()
    width = max(len(name) for _, name, _, _ in rows)
    for code, name, summary, _ in rows:
        typer.echo(f"{code}  {name:<{width}}  {summary}")


@commands.command(
    "explain",
    cls=ReadableHelp,
    help="Print the documentation of one rule, e.g. `accel-migrate explain AM003` or "
    "`accel-migrate explain replace-loss-backward`.",
)
def explain_command(
    code: str = typer.Argument(
        ...,
        help="A rule code (AM003), a rule name (replace-loss-backward) or its module name (replace_loss_backward).",
        metavar="RULE",
    ),
) -> None:
    table = _rule_table()
    keys = {key: row for row in table for key in (row[0].upper(), _name_key(row[1]))}
    row = keys.get(code.strip().upper()) or keys.get(_name_key(code))
    if row is None:
        import difflib

        close = difflib.get_close_matches(_name_key(code), [_name_key(r[1]) for r in table], n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        typer.echo(
            f"accel-migrate: error: no rule {code!r}; {hint}the codes are {', '.join(sorted(r[0] for r in table))} "
            "(`accel-migrate rules` lists them with their names)",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED)
    _, name, _, doc = row
    typer.echo(f"{row[0]} ({name})\n\n{_dedent(doc)}")


def _verify_help() -> str:
    from migrate.verify import HELP as VERIFY_HELP

    return VERIFY_HELP


@commands.command(
    "verify",
    cls=ReadableHelp,
    help=_verify_help(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def verify_command(
    script: Path = typer.Argument(..., help="The training script to check (it is run).", metavar="SCRIPT"),
    args: Optional[list[str]] = typer.Argument(None, help="Arguments for the script, after `--`.", metavar="[-- ARGS]"),
    steps: Optional[int] = typer.Option(
        None, "--steps", min=0, metavar="N",
        help="Optimizer steps to run each version for (0: the whole script; default 10, with --synthetic 3, "
        "which also cuts every DataLoader pass to N batches).",
    ),
    rtol: float = typer.Option(1e-5, "--rtol", min=0.0, metavar="TOL", help="Relative tolerance for 'within tolerance'."),
    atol: float = typer.Option(1e-7, "--atol", min=0.0, metavar="TOL", help="Absolute tolerance for 'within tolerance'."),
    target: str = typer.Option("runtime", "--target", metavar="[runtime|accelerate]", help="Migrate for runtime (bundled) or accelerate (HF)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PYTHON", help="Interpreter for the runs (default: this one)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, metavar="SECONDS", help="Seconds each process may run; past it, it writes where it is (a hang names its rank and line) and exits."),
    keep: Optional[Path] = typer.Option(
        None, "--keep", metavar="DIR", help="Keep the migrated copy, bootstrap and run folders in this (new or empty) folder."
    ),
    nproc: int = typer.Option(
        1, "--nproc-per-node", min=1, metavar="N",
        help="Run the migrated copy on N gloo CPU processes (torch.distributed.run, split_batches) against the original on 1.",
    ),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed for Python's, torch's and numpy's RNGs before each run."),
    synthetic: bool = typer.Option(
        False, "--synthetic",
        help="Replace the script's data, pretrained weights and CUDA by generated data of the same structure, "
        "on CPU (see docs/verify.md); compare the 1-process runs, then run the migrated copy on --nproc-per-node processes.",
    ),
    unit: Optional[Path] = typer.Option(
        None, "--unit", metavar="DIR",
        help="With --synthetic: the repository folder holding SCRIPT; it is migrated whole (as `accel-migrate DIR`) "
        "into the temporary folder and SCRIPT runs from that copy.",
    ),
) -> None:
    from migrate.config import TARGETS
    from migrate.verify import verify

    if target not in TARGETS:
        _fail_usage(f"--target must be one of {', '.join(TARGETS)}, not {target!r}")
    if keep is not None and keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
        _fail_usage(f"--keep {keep} exists and is not an empty folder")
    if nproc > 1 and target != "runtime":
        _fail_usage(f"--nproc-per-node {nproc} needs --target runtime (HF Accelerate runs several CPU processes only through MPI)")
    from migrate.verify import DEFAULT_STEPS, DEFAULT_SYNTHETIC_STEPS

    if steps is None:
        steps = DEFAULT_SYNTHETIC_STEPS if synthetic else DEFAULT_STEPS
    if unit is not None and not synthetic:
        _fail_usage("--unit needs --synthetic")
    if unit is not None and not unit.is_dir():
        _fail_usage(f"--unit {unit}: not a folder")
    if synthetic and steps == 0:
        _fail_usage("--synthetic needs --steps N > 0 (every DataLoader pass yields N batches)")
    where = "" if nproc == 1 else f" on {nproc} processes"
    typer.echo(
        f"accel-migrate verify: running {script} and its migrated copy{where} ({steps or 'all'} optimizer steps each)",
        err=True,
    )
    result = verify(
        script, list(args or []), steps=steps, rtol=rtol, atol=atol, target=target, python=python,
        timeout=timeout, keep=keep, nproc=nproc, seed=seed, synthetic=synthetic,
        unit=unit,
    )
    if result.exit_code == 2:
        typer.echo(f"accel-migrate verify: error: {result.message}", err=True)
    else:
        typer.echo(result.message)
    raise typer.Exit(result.exit_code)


def _name_key(name: str) -> str:
    """A rule name as typed: `replace-loss-backward`, `replace_loss_backward` and `Replace-Loss-Backward` alike."""
    return name.strip().lower().replace("_", "-")


def _dedent(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)


