"""``python -m nvfp4stack.bundle build|rechunk|install``: offline install bundles for air-gapped GPU hosts."""
from __future__ import annotations

import argparse
import sys

from nvfp4stack.bundle.build import DEFAULT_CHUNK_MIB


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nvfp4stack.bundle", description=__doc__)
    sub = ap.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("build", help="resolve, download and chunk wheels for a target host")
    b.add_argument("requirements", nargs="+", help="e.g. vllm==0.26.0 openai hydra-core omegaconf")
    b.add_argument("--out", required=True, help="directory for the chunk-NNN folders (replaced)")
    b.add_argument("--python-version", default="3.12", help="the target's Python (default 3.12)")
    b.add_argument("--freeze", help="the target's `pip freeze` output; default: this workplace's GPU image list")
    b.add_argument("--chunk-mib", type=float, default=DEFAULT_CHUNK_MIB,
                   help=f"largest chunk folder, MiB (default {DEFAULT_CHUNK_MIB})")
    b.add_argument("--exclude", action="append", default=None,
                   help="name pattern never bundled (repeatable; default: torch, triton, nvidia-*, cuda-*, ...)")
    r = sub.add_parser("rechunk", help="the same wheels in chunks of another size, no download")
    r.add_argument("bundle", help="a bundle's directory (its chunk-NNN folders)")
    r.add_argument("--out", required=True, help="directory for the new chunk-NNN folders (replaced)")
    r.add_argument("--chunk-mib", type=float, default=DEFAULT_CHUNK_MIB,
                   help=f"largest chunk folder, MiB (default {DEFAULT_CHUNK_MIB})")
    i = sub.add_parser("install", help="verify and install a bundle (same as install.sh --offline DIR)")
    i.add_argument("bundle")
    i.add_argument("--target")
    i.add_argument("--verify-only", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "install":
        from nvfp4stack.bundle import install

        return install.main([args.bundle, *(["--target", args.target] if args.target else []),
                             *(["--verify-only"] if args.verify_only else [])])
    from nvfp4stack.bundle.build import DEFAULT_EXCLUDE, build, rechunk

    if args.verb == "rechunk":
        try:
            rechunk(args.bundle, args.out, args.chunk_mib)
        except RuntimeError as e:   # BundleError included: a missing or corrupt chunk, named
            print(e, file=sys.stderr)
            return 2
        return 0
    try:
        build(args.requirements, args.out, python_version=args.python_version, freeze=args.freeze,
              exclude=tuple(args.exclude) if args.exclude else DEFAULT_EXCLUDE, chunk_mib=args.chunk_mib)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
