"""The thin Hydra shim: ``python main.py [overrides...] <command>``.

Hydra does not parse bare words, so the command word is lifted out of argv (in any position)
and passed as ``command=<word>``; ``recipe=<name>`` picks a file from the top-level recipes/
folder. Everything else is Hydra's own parsing (``-m`` sweeps included). Task functions get a
typed ``RootConfig`` and never see Hydra.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
RECIPES_DIR = ROOT / "recipes"

# Hydra flags that take a value in the next argv slot (so that value is no command word).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--cfg", "-c", "--package", "-p", "--experimental-rerun"}
_INFO_FLAGS = {"--info", "-i"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _user_errors() -> tuple[type[BaseException], ...]:
    from nvfp4stack.kernels.select import BackendError
    from nvfp4stack.plan.planner import PlanError

    # The project's errors for people are these types, their messages naming the key, the value
    # and the fix (the traceback still goes to the run's cli.log).
    return (PlanError, BackendError, FileNotFoundError, ValueError, KeyError)


# The exit-code contract (README "Exit codes"): 0 done; 1 a check found problems (doctor, eval
# thresholds, a plan where nothing fits); 2 a usage or config error, one line naming the key, the
# value and the valid choices; 3 an unexpected failure, one line plus the log holding the
# traceback; 130 interrupted.
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_UNEXPECTED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(SystemExit):
    """A command-line mistake: printed as one clear paragraph, exit code 2."""

    def __init__(self, message: str):
        print(f"nvfp4stack: {message}", file=sys.stderr)
        super().__init__(2)


def split_command(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """Lift the bare command word out of argv.

    Returns (command or None, overrides, hydra flags). Flags go first when argv is rebuilt:
    Hydra's argparse cannot interleave flags with its positional overrides.
    """
    from nvfp4stack.config import COMMANDS

    command, overrides, flags = None, [], []
    take_value = False
    for arg in argv:
        if take_value:
            flags.append(arg)
            take_value = False
        elif arg in _FLAGS_WITH_VALUE:
            flags.append(arg)
            take_value = True
        elif flags and flags[-1] in _INFO_FLAGS and arg in _INFO_TOPICS:
            flags.append(arg)
        elif arg.startswith("-"):
            flags.append(arg)
        elif "=" in arg:
            overrides.append(arg)
        elif arg not in COMMANDS:
            raise UsageError(f"unknown command {arg!r}; valid commands: {', '.join(COMMANDS)}")
        elif command is not None:
            raise UsageError(f"two commands given ({command!r} and {arg!r}); give exactly one of: {', '.join(COMMANDS)}")
        else:
            command = arg
    return command, overrides, flags


def _fields(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _dataclass_of(tp: object) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def check_override_keys(overrides: list[str]) -> None:
    """Reject an unknown config key up front, listing the valid keys at that level."""
    from nvfp4stack.config import GROUPS, RootConfig

    for ov in overrides:
        if ov.startswith(("-", "+", "~", "hydra.", "hydra/")) or "=" not in ov:
            continue
        key = ov.split("=", 1)[0]
        if key == "recipe":
            continue
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in GROUPS:
            _check_group_option(parts[0], ov.split("=", 1)[1])  # e.g. arch=sm90
            continue
        cls: type | None = RootConfig
        for depth, part in enumerate(parts):
            fields = _fields(cls)
            if part not in fields:
                where = ".".join(parts[:depth]) or "the root config"
                raise UsageError(
                    f"unknown config key {key!r}: {where} has no {part!r}; valid keys there: "
                    f"{', '.join(sorted(fields))}"
                )
            cls = _dataclass_of(fields[part])
            if cls is None:
                break


def _check_group_option(group: str, value: str) -> None:
    """``arch=sm100`` -> one line naming the valid options (and the closest), not Hydra's dump."""
    import difflib

    valid = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    for name in value.split(","):  # a multirun sweep lists several
        if valid and name not in valid:
            # a prefix first (sm100 -> sm100a, the arch-specific target), else the closest spelling
            close = [v for v in valid if v.startswith(name)] or difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
            hint = f"; did you mean {group}={close[0]}?" if close else ""
            raise UsageError(f"{group}={name!r} is not an option of config group {group!r}; valid: "
                             f"{', '.join(valid)}{hint}")


def _recipe_override(args: list[str]) -> list[str]:
    """``recipe=X`` chooses the global-package config group ``recipes`` (top-level recipes/)."""
    out = []
    for arg in args:
        if arg.startswith("recipe="):
            names = arg.split("=", 1)[1]
            for name in names.split(","):
                if name and not (RECIPES_DIR / f"{name}.yaml").exists():
                    valid = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
                    raise UsageError(f"unknown recipe {name!r}; valid recipes (in {RECIPES_DIR}): {', '.join(valid)}")
            arg = f"recipes@_global_={names}"
        out.append(arg)
    return out


def compose_config(*overrides: str):
    """The typed RootConfig for CLI-style overrides (``recipe=X`` included) without running a command:
    for notebooks, scripts and tests. Keys are checked like the CLI's."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from nvfp4stack.config import register_configs

    check_override_keys(list(overrides))
    register_configs()
    args = [*_recipe_override(list(overrides)), f"hydra.searchpath=[file://{ROOT}]"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return OmegaConf.to_object(compose("config", overrides=args))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        from nvfp4stack.config import COMMANDS

        print(f"usage: python main.py [-m] [key=value ...] <command>\n  commands: {', '.join(COMMANDS)}\n"
              f"  recipes: {', '.join(sorted(p.stem for p in RECIPES_DIR.glob('*.yaml')))}\n"
              "  e.g.: python main.py recipe=<recipe> plan\n(Hydra's own help follows)\n")
    command, overrides, flags = split_command(argv)
    check_override_keys(overrides)
    overrides = _recipe_override(overrides)
    if command is not None:
        overrides.append(f"command={command}")
    overrides.append(f"hydra.searchpath=[file://{ROOT}]")
    sys.argv = [sys.argv[0] if sys.argv else "nvfp4stack", *flags, *overrides]
    _hydra_entry()


def _hydra_entry() -> None:
    import hydra
    from omegaconf import DictConfig

    from nvfp4stack.config import register_configs

    register_configs()

    failures: list[str] = []

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
    def _run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        code = run_from_dictconfig(cfg)
        if code and HydraConfig.get().mode == RunMode.MULTIRUN:
            # One job's failure must not hide the others: finish the sweep, fail at the end.
            failures.append(f"job {HydraConfig.get().job.num} ({' '.join(HydraConfig.get().overrides.task)}): exit {code}")
        elif code:
            raise SystemExit(code)

    _run()
    if failures:
        print("failed jobs:\n  " + "\n  ".join(failures), file=sys.stderr)
        raise SystemExit(1)


def run_from_dictconfig(cfg) -> int:
    """Turn the composed DictConfig into the typed config and run the command's task."""
    import importlib

    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    try:
        typed = OmegaConf.to_object(cfg)
    except (ValidationError, ValueError) as e:
        raise UsageError(f"invalid configuration: {e}") from None
    task = importlib.import_module(f"nvfp4stack.tasks.{typed.command}")
    from nvfp4stack.run_dir import prepare_run_dir
    from nvfp4stack.train.config import warn_unused_train

    def run() -> int:
        warn_unused_train(typed)  # train.* given to serve/eval/...: say that only `train` reads it
        return task.run(typed)

    run_dir = prepare_run_dir(typed, OmegaConf.to_yaml(cfg, resolve=True))
    return run_task(run, typed.command, run_dir / "cli.log")


def run_task(run, command: str, log_path: Path) -> int:
    """Run one task under the exit-code contract, its output teed into ``log_path`` (cli.log)."""
    with _tee_to(log_path):
        try:
            return int(run() or 0)
        except _user_errors() as e:
            # Errors written for people (they name the key, the expectation and the fix).
            _log_traceback(log_path)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            print(f"nvfp4stack {command}: error: {msg}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"nvfp4stack {command}: interrupted (Ctrl-C); rerun the same command to go on "
                  "where it can resume", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as e:  # not written for people: one line here, the traceback in the log
            _log_traceback(log_path)
            print(f"nvfp4stack {command}: unexpected error: {type(e).__name__}: {e} "
                  f"(traceback in {log_path})", file=sys.stderr)
            return EXIT_UNEXPECTED


def _log_traceback(log_path: Path) -> None:
    import traceback

    with open(log_path, "a") as f:
        f.write(traceback.format_exc())


class _Tee:
    """A text stream that writes to the original stream and to the run's log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    # A logging handler made during one job of a multirun (vLLM's, when a job imports it) keeps that
    # job's Tee after its log is closed: later jobs' records still reach the terminal, not that log.
    def write(self, text):
        if not self.log.closed:
            self.log.write(text)
        return self.stream.write(text)

    def flush(self):
        if not self.log.closed:
            self.log.flush()
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _tee_to:
    """Within the block, stdout and stderr also go to ``path`` (the run directory's cli.log)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.log = open(self.path, "a", buffering=1)
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, self.log), _Tee(sys.stderr, self.log)
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self.saved
        self.log.close()
        return False
