"""The thin Hydra shim: ``python main.py [overrides...] <command>``.

Hydra does not parse bare words, so the command word is lifted out of argv (in any position)
and passed as ``command=<word>``; ``recipe=<name>`` picks a file from the top-level recipes/
folder. Everything else is Hydra's own parsing (``-m`` sweeps included). Task functions get a
typed ``RootConfig`` and never see Hydra.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from nvfp4stack.overrides import check_overrides, describe_config_error
from nvfp4stack.usage import (  # noqa: F401  (re-exports)
    COMMANDS,
    CONF_DIR,
    RECIPES_DIR,
    ROOT,
    ConfigWarning,
    UsageError,
    did_you_mean,
    help_text,
    recipes,
)

# Hydra flags that take a value in the next argv slot (so that value is no command word).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--cfg", "-c", "--package", "-p", "--experimental-rerun"}
_INFO_FLAGS = {"--info", "-i"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
_SWEEP_FLAGS = {"-m", "--multirun"}


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


def split_command(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """Lift the bare command word out of argv.

    Returns (command or None, overrides, hydra flags). Flags go first when argv is rebuilt:
    Hydra's argparse cannot interleave flags with its positional overrides.
    """
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
        elif "=" in arg or arg.startswith("~"):  # ~key deletes a key
            overrides.append(arg)
        elif arg not in COMMANDS:
            raise UsageError(f"unknown command {arg!r}; valid commands: {', '.join(COMMANDS)}"
                             f"{did_you_mean(arg, COMMANDS)}")
        elif command is not None:
            raise UsageError(f"two commands given ({command!r} and {arg!r}); give exactly one of: {', '.join(COMMANDS)}")
        else:
            command = arg
    return command, overrides, flags


def _recipe_override(args: list[str]) -> list[str]:
    """``recipe=X`` chooses the global-package config group ``recipes`` (top-level recipes/)."""
    out = []
    for arg in args:
        if arg.startswith("recipe="):
            names = arg.split("=", 1)[1]
            for name in names.split(","):
                if name and not (RECIPES_DIR / f"{name}.yaml").exists():
                    valid = recipes()
                    raise UsageError(f"unknown recipe {name!r}; valid recipes (in {RECIPES_DIR}): {', '.join(valid)}"
                                     f"{did_you_mean(name, valid, 'recipe=')}")
            arg = f"recipes@_global_={names}"
        out.append(arg)
    return out


def compose_config(*overrides: str):
    """The typed RootConfig for CLI-style overrides (``recipe=X`` included) without running a command:
    for notebooks, scripts and tests. Overrides are checked like the CLI's."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from nvfp4stack.config import register_configs

    check_overrides(list(overrides))
    register_configs()
    args = [*_recipe_override(list(overrides)), f"hydra.searchpath=[file://{ROOT}]"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return OmegaConf.to_object(compose("config", overrides=args))


# What the one Ctrl-C line names: "nvfp4stack <command>" once the command word is known.
_label = "nvfp4stack"


def _exit_on_ctrl_c(signum, frame) -> None:
    """SIGINT outside a task: one line, exit 130. Before a task starts (imports, Hydra's composition)
    there is nothing to undo, and a KeyboardInterrupt raised inside a library's import can print a
    47-line traceback or be swallowed by its bare ``except``."""
    os.write(2, f"{_label}: interrupted (Ctrl-C)\n".encode())
    os._exit(EXIT_INTERRUPTED)


def main(argv: list[str] | None = None) -> None:
    """``python main.py [-m] [key=value ...] <command>``: exits under the contract above."""
    global _label
    signal.signal(signal.SIGINT, _exit_on_ctrl_c)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        # A bare `python main.py` asks what there is to run: the help, exit 0 (it used to run `plan`).
        try:
            print(help_text(next((a for a in argv if a in COMMANDS), None)), flush=True)
        except BrokenPipeError:  # `python main.py --help | head`
            os._exit(EXIT_OK)
        raise SystemExit(EXIT_OK)
    command, overrides, flags = split_command(argv)
    if command is not None:
        _label = f"nvfp4stack {command}"
    elif not any(o.startswith("command=") for o in overrides) and set(flags) <= _SWEEP_FLAGS:
        raise UsageError(f"no command given; add one of: {', '.join(COMMANDS)} "
                         f"(e.g. python main.py {' '.join(argv)} plan; python main.py --help says what each does)")
    check_overrides(overrides)
    overrides = _recipe_override(overrides)
    if command is not None:
        overrides.append(f"command={command}")
    overrides.append(f"hydra.searchpath=[file://{ROOT}]")
    sys.argv = [sys.argv[0] if sys.argv else "nvfp4stack", *flags, *overrides]
    try:
        _hydra_entry()
    except KeyboardInterrupt:  # in the moment between a task's own handling and Hydra's return
        print(f"{_label}: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def _hydra_entry() -> None:
    import hydra
    from hydra.errors import HydraException
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

    from nvfp4stack.config import register_configs

    register_configs()

    failures: list[str] = []

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
    def _run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        code = run_from_dictconfig(cfg)
        if code and code != EXIT_INTERRUPTED and HydraConfig.get().mode == RunMode.MULTIRUN:
            # One job's failure must not hide the others: finish the sweep, fail at the end.
            failures.append(f"job {HydraConfig.get().job.num} ({' '.join(HydraConfig.get().overrides.task)}): exit {code}")
        elif code:
            raise SystemExit(code)  # Ctrl-C stops a sweep too

    # Hydra's errors (composition, a sweep job's overrides) reach this function instead of Hydra's
    # 7-line report and exit 1: each becomes one line under the contract.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _run()
    except (HydraException, OmegaConfBaseException) as e:
        raise UsageError(describe_config_error(e)) from None
    except BrokenPipeError:  # Hydra's own printing (--cfg, --hydra-help) into `| head`
        os._exit(EXIT_OK)
    except Exception as e:  # outside any task (its run dir may not exist): log to a temp file
        import tempfile
        import traceback

        fd, log = tempfile.mkstemp(prefix="nvfp4stack-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(traceback.format_exc())
        print(f"{_label}: unexpected error: {type(e).__name__}: {' '.join(str(e).split())} (traceback in {log})",
              file=sys.stderr)
        raise SystemExit(EXIT_UNEXPECTED) from None
    if failures:
        print("failed jobs:\n  " + "\n  ".join(failures), file=sys.stderr)
        raise SystemExit(1)


def run_from_dictconfig(cfg) -> int:
    """Turn the composed DictConfig into the typed config and run the command's task."""
    import importlib

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # e.g. an interpolation that does not resolve
        raise UsageError(f"invalid configuration: {describe_config_error(e)}") from None
    except ValueError as e:  # a schema's __post_init__: one line naming the key
        raise UsageError(f"invalid configuration: {' '.join(str(e).split())}") from None
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
    with _tee_to(log_path), _ctrl_c_raises(), _one_line_warnings(command):
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


@contextlib.contextmanager
def _ctrl_c_raises():
    """Within a task Ctrl-C raises KeyboardInterrupt, so the task can stop its children and leave
    resumable state (outside one, the CLI exits at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _one_line_warnings(command: str):
    """A ConfigWarning prints as ``nvfp4stack <command>: warning: ...``; other warnings as Python does."""
    import warnings

    with warnings.catch_warnings():
        python_shows = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, ConfigWarning):
                print(f"nvfp4stack {command}: warning: {message}", file=sys.stderr)
            else:
                python_shows(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


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
