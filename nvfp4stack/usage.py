"""What a person types: the command words, their help text, and the one-line usage error.

Standard library only: ``--help`` and a bare ``python main.py`` answer from here without importing
torch, vLLM or Hydra (nvfp4stack.config imports torch through the converters).
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
RECIPES_DIR = ROOT / "recipes"


@dataclass(frozen=True)
class Command:
    what: str
    keys: tuple[str, ...]       # the keys a person sets most for this command (tests check they exist)
    examples: tuple[str, ...]


_COMMANDS = {
    "plan": Command(
        "per tensor group: source format -> target scheme, converter, kernel backend, bytes; per-GPU "
        "weight and KV-cache bytes; writes plan.json",
        ("model", "arch", "precision.routed_experts", "precision.rules", "backend.moe", "backend.linear",
         "engine.tp", "engine.ep"),
        ("python main.py recipe=qwen3_235b_b200 plan",
         "python main.py recipe=qwen3_235b_b200 arch=sm90 backend.moe=auto plan")),
    "quantize": Command(
        "modelopt PTQ (quantize.method=modelopt) or the data-free MXFP4 -> NVFP4 cast "
        "(quantize.method=cast); writes a checkpoint",
        ("quantize.method", "quantize.source", "quantize.base", "quantize.output_dir", "quantize.calib_samples",
         "quantize.amax_path", "model.path"),
        ("python main.py quantize", "python main.py recipe=tiny_qwen3_moe quantize")),
    "convert": Command(
        "streaming, resumable, atomic checkpoint conversion following the plan",
        ("convert.src", "convert.dst", "convert.overwrite", "model.path", "precision.rules"),
        ("python main.py convert",)),
    "serve": Command(
        "vLLM's OpenAI server with the recipe's engine args (engine.dry_run=true prints them)",
        ("model.path", "engine.host", "engine.port", "engine.tp", "engine.dry_run", "backend.moe",
         "engine.max_model_len"),
        ("python main.py serve", "python main.py recipe=qwen3_235b_b200 serve engine.dry_run=true")),
    "eval": Command(
        "fidelity against the bf16 reference (layer test, end to end, or task scoring on a live server)",
        ("eval.level", "eval.num_prompts", "eval.max_tokens", "eval.tasks_file", "eval.endpoint",
         "eval.reference_path"),
        ("python main.py eval", "python main.py recipe=tiny_qwen3_moe eval eval.level=e2e")),
    "bench": Command(
        "benchmarks: bench=formats, bench=moe_kernel, bench=cold_start, bench=engine",
        ("bench", "bench.device", "bench.repeat", "bench.tokens_per_expert"),
        ("python main.py bench bench=cold_start",)),
    "doctor": Command(
        "validates a checkpoint (checkpoint=PATH) against the plan and vLLM's loader; exit 1 on errors",
        ("checkpoint", "model"),
        ("python main.py doctor checkpoint=PATH",)),
    "train": Command(
        "trains the recipe's tiny model on the stdlib corpus; cached, with a manifest",
        ("train.steps", "train.batch_size", "train.lr", "train.seed"),
        ("python main.py train",)),
}
COMMANDS = tuple(_COMMANDS)
_GROUPS = ("model", "arch", "precision", "backend", "engine", "quantize", "convert", "eval", "bench", "train")


def command_help(command: str) -> Command:
    return _COMMANDS[command]


def recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def help_text(command: str | None = None) -> str:
    """``python main.py --help`` (all commands) or ``python main.py <command> --help`` (one)."""
    lines = ["usage: python main.py [-m] [key=value ...] <command>   (the command word may stand anywhere)", ""]
    if command is None:
        lines.append("commands:")
        for name, c in _COMMANDS.items():
            lines.append(f"  {name:<9} {c.what}")
        lines += ["", "main keys and examples: python main.py <command> --help"]
    else:
        c = _COMMANDS[command]
        lines += [f"{command}: {c.what}", "", "main keys: " + ", ".join(c.keys), "examples:"]
        lines += [f"  {e}" for e in c.examples]
    lines += [
        "",
        f"recipes (recipe=<name>; default tiny_cpu): {', '.join(recipes())}",
        f"config groups (group=<option>, group.key=value): {', '.join(_GROUPS)}",
        "python main.py <command> --cfg job   prints the composed config without running it",
        "-m key=a,b ...                        runs one job per value (a sweep)",
        "--hydra-help                          Hydra's own help",
        "exit codes: 0 done, 1 a check found problems, 2 usage or config error, 3 unexpected failure, 130 Ctrl-C",
    ]
    return "\n".join(lines)


def did_you_mean(name: str, valid, prefix: str = "") -> str:
    """'; did you mean <prefix><closest>?' or ''.

    A prefix match first (sm100 -> sm100a, the arch-specific target), else the closest spelling of a
    name or of its tail after an underscore (trtlm -> flashinfer_trtllm).
    """
    valid = list(valid)
    close = [v for v in valid if name and v.startswith(name)]
    if not close:
        spellings: dict[str, str] = {}
        for v in valid:
            parts = v.split("_")
            for i in range(len(parts)):
                spellings.setdefault("_".join(parts[i:]), v)
        close = [spellings[m] for m in difflib.get_close_matches(name, list(spellings), n=1, cutoff=0.6)]
    return f"; did you mean {prefix}{close[0]}?" if close else ""


class ConfigWarning(UserWarning):
    """A setting that selects nothing (a rule target, a role the model lacks): the CLI prints it as
    one line, without Python's source line."""


class UsageError(SystemExit):
    """A command-line mistake: printed as one line, exit code 2."""

    def __init__(self, message: str):
        print(f"nvfp4stack: {message}", file=sys.stderr)
        super().__init__(2)
