"""Before serving: does this host have the arch the recipe was planned for?"""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.arch import Arch, detect

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def recipes_for_arch(arch: Arch) -> list[str]:
    """Recipes whose arch override names ``arch`` (read from the recipe files themselves)."""
    out = []
    for p in sorted(RECIPES_DIR.glob("*.yaml")):
        if f"override /arch: {arch.name}" in p.read_text():
            out.append(p.stem)
    return out


def host_mismatch(recipe: str, arch_name: str, host: Arch | None = None) -> str | None:
    """One paragraph saying why this host cannot serve the recipe, or None when it can."""
    host = host or detect()
    if arch_name in ("auto", host.name):
        return None
    fits = recipes_for_arch(host)
    fit_text = (f"Recipes planned for {host.name}: {', '.join(fits)} (python main.py recipe={fits[0]} serve)."
                if fits else f"No recipe targets {host.name}.")
    return (
        f"recipe {recipe} is planned for arch {arch_name}, but this host is {host.name}"
        f"{' (no CUDA GPU)' if not host.is_cuda else ''}. Its kernels (chosen for {arch_name}) cannot run "
        f"here. {fit_text} To re-plan this recipe for this host use arch={host.name} (or arch=auto), and "
        f"check the result with 'python main.py recipe={recipe} arch={host.name} plan'; to only see the "
        f"engine arguments, add engine.dry_run=true."
    )
