"""Install an offline bundle: verify every chunk, reassemble split wheels, ``pip install`` them.

Standard library only, and runnable as a plain script (``python3 nvfp4stack/bundle/install.py
DIR [--target T]``, what ``bash install.sh --offline DIR`` calls): the GPU host it runs on may have
nothing but python3 and pip. DIR holds the ``chunk-NNN`` folders, copied from wherever the bundle
was built. Nothing is installed unless every chunk and every wheel checks out.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1


class BundleError(RuntimeError):
    """A missing or corrupt chunk or wheel: the message names it and the fix."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def chunk_digest(files: dict[str, str]) -> str:
    """A chunk's sha256: over its files' names and sha256, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]}\n".encode())
    return h.hexdigest()


def load_manifest(bundle: Path) -> dict:
    found = sorted(bundle.glob(f"chunk-*/{MANIFEST}"))
    if not found:
        raise BundleError(f"{bundle}: no chunk-NNN/{MANIFEST}; expected the folders `python -m nvfp4stack.bundle "
                          "build` wrote (chunk-000, chunk-001, ...). Fix: copy every chunk folder into this directory")
    manifest = json.loads(found[0].read_text())
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{found[0]}: bundle format {manifest.get('format')!r}, this installer reads {FORMAT}; "
                          "rebuild the bundle with this nvfp4stack version")
    return manifest


def verify(bundle: Path, manifest: dict) -> None:
    """Every chunk present and intact, each file's sha256 as recorded; raises BundleError naming
    every missing or corrupt chunk."""
    problems = []
    for chunk, entry in sorted(manifest["chunks"].items()):
        d = bundle / chunk
        if not d.is_dir():
            problems.append(f"{chunk}: missing (expected {len(entry['files'])} file(s), "
                            f"{entry['bytes']:,} bytes). Fix: copy {chunk} from the bundle into {bundle}")
            continue
        for name, want in sorted(entry["files"].items()):
            f = d / name
            if not f.is_file():
                problems.append(f"{chunk}/{name}: missing. Fix: re-copy {chunk}")
                continue
            got = sha256_file(f)
            if got != want:
                problems.append(f"{chunk}/{name}: corrupt, sha256 {got[:16]}... expected {want[:16]}.... "
                                f"Fix: re-copy {chunk}")
        if chunk_digest(entry["files"]) != entry["sha256"]:
            problems.append(f"{chunk}: its manifest entry does not match its file list; rebuild the bundle")
    if problems:
        raise BundleError(f"bundle {bundle} failed verification, nothing installed:\n  " + "\n  ".join(problems))


def reassemble(bundle: Path, manifest: dict, out: Path) -> list[Path]:
    """Wheels in install order, split ones joined from their parts and checked against their sha256."""
    wheels = []
    for w in manifest["wheels"]:
        dst = out / w["file"]
        with open(dst, "wb") as f:
            for part in w["parts"]:
                f.write((bundle / part["chunk"] / part["file"]).read_bytes())
        got = sha256_file(dst)
        if got != w["sha256"]:
            chunks = ", ".join(sorted({p["chunk"] for p in w["parts"]}))
            raise BundleError(f"{w['file']}: reassembled sha256 {got[:16]}... expected {w['sha256'][:16]}...; "
                              f"nothing installed. Fix: re-copy {chunks}")
        wheels.append(dst)
    return wheels


def install(bundle: str | Path, target: str | None = None, python: str = sys.executable,
            dry_run: bool = False) -> list[str]:
    """Verify, reassemble and pip-install the bundle; returns the wheel file names installed."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    verify(bundle, manifest)
    with tempfile.TemporaryDirectory(prefix="nvfp4stack-bundle-") as tmp:
        wheels = reassemble(bundle, manifest, Path(tmp))
        print(f"bundle {bundle}: {len(manifest['chunks'])} chunk(s) and {len(wheels)} wheel(s) verified", flush=True)
        if not dry_run:
            cmd = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--quiet",
                   *(["--target", str(target), "--upgrade"] if target else []), *map(str, wheels)]
            r = subprocess.run(cmd)
            if r.returncode:
                raise BundleError(f"pip install of the verified wheels failed (exit {r.returncode}); its output is "
                                  "above. The wheels are intact: check the target's Python "
                                  f"({manifest['target'].get('python_version')}) and platform")
        return [w.name for w in wheels]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", help="directory holding the chunk-NNN folders")
    ap.add_argument("--target", help="pip --target directory (then add it to PYTHONPATH); default: this env")
    ap.add_argument("--verify-only", action="store_true", help="check every chunk and wheel, install nothing")
    args = ap.parse_args(argv)
    try:
        names = install(args.bundle, args.target, dry_run=args.verify_only)
    except BundleError as e:
        print(f"install --offline: {e}", file=sys.stderr)
        return 2
    where = f" into {args.target} (export PYTHONPATH={args.target})" if args.target else ""
    print(f"{'verified' if args.verify_only else 'installed'} {len(names)} wheel(s){where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
