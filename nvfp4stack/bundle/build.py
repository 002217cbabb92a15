"""Build an offline bundle: resolve for the target, download, split into chunk folders, manifest.

Resolution is pip's own (``pip install --dry-run --report`` for the target's Python version and
platform tags, with the target's versions as constraints when a ``pip freeze`` is given), so the
wheels are the ones pip would pick on the target. What the target already has, and the excluded
patterns (CUDA runtime wheels, torch, compilers), are left out. Source-only pure-Python
dependencies (antlr4-python3-runtime 4.9.3, needed by omegaconf) are built into wheels here first.
"""
from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nvfp4stack.bundle.install import FORMAT, MANIFEST, chunk_digest, sha256_file

MiB = 1 << 20
# a chunk travels with the working tree, 64 MiB a run: 48 leaves room for a tree up to ~15 MiB (56 stopped fitting
# when the tree passed 7.5 MiB, 2026-11-29; tests/bundle/test_chunk_size.py keeps the margin)
DEFAULT_CHUNK_MIB = 48
# pip matches platform tags exactly: every glibc level up to the GPU hosts' (Ubuntu 24.04: 2.39)
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)), "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
# Never bundled: the GPU host's own CUDA stack and torch build, and large wheels a served model
# does not import (found by importing and serving vLLM 0.26 on an H200, 2026-11-26).
DEFAULT_EXCLUDE = ("torch", "torchvision", "torchaudio", "triton", "nvidia-*", "cuda-*", "tilelang",
                   "tokenspeed-*", "flashinfer-jit-cache", "flashinfer-cubin", "pynvvideocodec", "torchcodec",
                   "z3-solver")
# vLLM 0.26 on the GPU hosts: xgrammar 0.2.8 fails at import against apache-tvm-ffi 0.1.10.
DEFAULT_CONSTRAINTS = ("xgrammar==0.2.7", "apache-tvm-ffi==0.1.10")
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)
IMAGE_PACKAGES = Path(__file__).with_name("gpu_image_packages.txt")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Target:
    python_version: str = "3.12"
    platforms: tuple[str, ...] = PLATFORMS
    has: dict[str, str | None] = field(default_factory=dict)   # canonical name -> version or None

    @classmethod
    def from_freeze(cls, python_version: str, freeze: str | Path | None) -> "Target":
        """Installed packages from a ``pip freeze`` file, else this workplace's GPU image list."""
        has: dict[str, str | None] = {}
        if freeze:
            for line in Path(freeze).read_text().splitlines():
                m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:==\s*([^\s;#]+))?", line)
                if m and not line.lstrip().startswith(("#", "-")):
                    has[canonical(m.group(1))] = m.group(2)
        else:
            for line in IMAGE_PACKAGES.read_text().splitlines():
                if not line.startswith("#"):
                    has.update({canonical(n): None for n in line.split()})
        return cls(python_version, PLATFORMS, has)

    def pip_tags(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp"]
        for p in self.platforms:
            args += ["--platform", p]
        return args

    def constraints(self) -> list[str]:
        """The target's own versions (local labels such as +cu130 dropped): resolve around them."""
        return [f"{n}=={re.sub(r'[+].*$', '', v)}" for n, v in sorted(self.has.items()) if v]


def excluded(name: str, patterns) -> bool:
    return any(fnmatch.fnmatch(canonical(name), canonical(p).replace("-*", "*")) or
               fnmatch.fnmatch(canonical(name), p) for p in patterns)


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def build_sdist_wheels(specs, out: Path) -> None:
    """Pure-Python packages published only as sources: build their wheels here (py3-none-any)."""
    for spec in specs:
        r = _pip("wheel", "--no-deps", "-q", "-w", str(out), spec)
        if r.returncode:
            raise RuntimeError(f"bundle: could not build a wheel of {spec} (source-only on PyPI): {r.stderr[-800:]}")


def resolve(requirements: list[str], target: Target, constraints: list[str], find_links: Path) -> list[dict]:
    """pip's resolution for the target: [{name, version, url, sha256, local}] of every wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        cfile = Path(tmp) / "constraints.txt"
        cfile.write_text("\n".join([*target.constraints(), *constraints]) + "\n")
        report = Path(tmp) / "report.json"
        r = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                 "--target", str(Path(tmp) / "t"), *target.pip_tags(), "--find-links", str(find_links),
                 "-c", str(cfile), *requirements)
        if r.returncode:
            raise RuntimeError(f"bundle: pip could not resolve {requirements} for Python {target.python_version} "
                               f"{target.platforms[0]}...: {r.stderr[-2000:]}")
        items = json.loads(report.read_text())["install"]
    out = []
    for it in items:
        info = it["download_info"]
        url = info["url"]
        out.append({"name": it["metadata"]["name"], "version": it["metadata"]["version"], "url": url,
                    "sha256": info.get("archive_info", {}).get("hashes", {}).get("sha256"),
                    "local": url.startswith("file:")})
    return out


def download(item: dict, dest: Path) -> Path:
    name = item["url"].rsplit("/", 1)[-1].split("#")[0]
    path = dest / urllib.request.unquote(name)
    if item["local"]:
        shutil.copy2(urllib.request.url2pathname(item["url"][len("file:"):]), path)
    else:
        with urllib.request.urlopen(item["url"], timeout=300) as resp, open(path, "wb") as f:
            shutil.copyfileobj(resp, f)
    if item["sha256"] and sha256_file(path) != item["sha256"]:
        raise RuntimeError(f"bundle: {path.name}: downloaded sha256 differs from the index's; retry the build")
    return path


def write_chunks(wheels: list[Path], out: Path, chunk_bytes: int, target: Target, meta: dict) -> dict:
    """Pack wheels (in install order) into chunk-NNN folders of at most ``chunk_bytes``; a wheel
    larger than the room left is split into parts across chunks. Writes the manifest into each."""
    # each chunk also carries the manifest: keep room for it so a chunk folder stays <= chunk_bytes
    reserve = min(256 << 10, chunk_bytes // 4)
    chunk_bytes -= reserve
    chunks: dict[str, dict[str, str]] = {}
    sizes: dict[str, int] = {}
    entries = []
    ci, used = 0, 0

    def chunk_dir(i: int) -> Path:
        d = out / f"chunk-{i:03d}"
        d.mkdir(parents=True, exist_ok=True)
        chunks.setdefault(d.name, {})
        sizes.setdefault(d.name, 0)
        return d

    for w in wheels:
        data_len, off, parts = w.stat().st_size, 0, []
        with open(w, "rb") as f:
            while off < data_len or not parts:
                room = chunk_bytes - used
                if room <= 0:
                    ci, used = ci + 1, 0
                    room = chunk_bytes
                n = min(room, data_len - off)
                whole = off == 0 and n == data_len
                fname = w.name if whole else f"{w.name}.part-{len(parts):03d}"
                d = chunk_dir(ci)
                (d / fname).write_bytes(f.read(n))
                sha = sha256_file(d / fname)
                chunks[d.name][fname] = sha
                sizes[d.name] += n
                parts.append({"chunk": d.name, "file": fname, "sha256": sha, "size": n})
                off, used = off + n, used + n
        entries.append({"file": w.name, "sha256": sha256_file(w), "size": data_len, "parts": parts})
    manifest = {"format": FORMAT, "target": {"python_version": target.python_version,
                                             "platforms": list(target.platforms)},
                **meta, "chunk_bytes": chunk_bytes + reserve, "wheels": entries,
                "chunks": {c: {"files": files, "sha256": chunk_digest(files), "bytes": sizes[c]}
                           for c, files in sorted(chunks.items())},
                "install": {"pip_args": ["--no-index", "--no-deps"]}}
    text = json.dumps(manifest, indent=1)
    if any(sizes[c] + len(text) > chunk_bytes + reserve for c in chunks):
        raise RuntimeError(f"bundle: the manifest ({len(text):,} bytes) does not fit beside the data in a "
                           f"chunk of {chunk_bytes:,} bytes; choose a larger chunk size")
    for c in chunks:
        (out / c / MANIFEST).write_text(text)
    return manifest


def build(requirements: list[str], out: str | Path, *, python_version: str = "3.12", freeze: str | None = None,
          exclude=DEFAULT_EXCLUDE, constraints=DEFAULT_CONSTRAINTS, sdist_only=SDIST_ONLY,
          chunk_mib: float = DEFAULT_CHUNK_MIB, progress: bool = True) -> dict:
    """Resolve, download and chunk ``requirements`` for the target into ``out`` (replaced atomically)."""
    from nvfp4stack.io_atomic import atomic_dir

    target = Target.from_freeze(python_version, freeze)
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="nvfp4stack-bundle-") as tmp:
        local = Path(tmp) / "local"
        local.mkdir()
        build_sdist_wheels(sdist_only, local)
        items = resolve(list(requirements), target, list(constraints), local)
        keep = [it for it in items if canonical(it["name"]) not in target.has and not excluded(it["name"], exclude)]
        left = sorted(it["name"] for it in items if it not in keep)
        dl = Path(tmp) / "wheels"
        dl.mkdir()
        wheels = []
        for i, it in enumerate(keep, 1):
            if progress:
                print(f"[bundle] {i}/{len(keep)} {it['name']}=={it['version']}", flush=True)
            wheels.append(download(it, dl))
        meta = {"requirements": list(requirements), "left_out": left,
                "packages": [f"{it['name']}=={it['version']}" for it in keep]}
        with atomic_dir(out) as staging:
            manifest = write_chunks(wheels, staging, int(chunk_mib * MiB), target, meta)
    total = sum(w["size"] for w in manifest["wheels"])
    print(f"[bundle] {out}: {len(manifest['wheels'])} wheel(s), {total / MiB:,.1f} MiB in "
          f"{len(manifest['chunks'])} chunk(s) of at most {chunk_mib:g} MiB; left out {len(left)} "
          "package(s) the target has or that are excluded", flush=True)
    return manifest


def rechunk(src: str | Path, out: str | Path, chunk_mib: float = DEFAULT_CHUNK_MIB) -> dict:
    """The same wheels in chunks of another size, with no download: ``src``'s chunks verified, its wheels
    reassembled and checked against their sha256, then written into ``out`` (replaced atomically)."""
    from nvfp4stack.bundle.install import load_manifest, reassemble, verify
    from nvfp4stack.io_atomic import atomic_dir

    src, out = Path(src), Path(out)
    s, o = src.resolve(), out.resolve()
    if s == o or s.is_relative_to(o) or o.is_relative_to(s):
        raise RuntimeError(f"bundle: rechunk writes a new bundle; --out {out} is the source, inside it or holds it "
                           f"({src}), and replacing it would lose the source. Fix: name a directory beside it, then "
                           "replace the old one")
    manifest = load_manifest(src)
    verify(src, manifest)
    target = Target(manifest["target"]["python_version"], tuple(manifest["target"]["platforms"]))
    meta = {k: manifest[k] for k in ("requirements", "left_out", "packages") if k in manifest}
    with tempfile.TemporaryDirectory(prefix="nvfp4stack-rechunk-") as tmp:
        wheels = reassemble(src, manifest, Path(tmp))
        with atomic_dir(out) as staging:
            new = write_chunks(wheels, staging, int(chunk_mib * MiB), target, meta)
    print(f"[bundle] {out}: {len(new['wheels'])} wheel(s) in {len(new['chunks'])} chunk(s) of at most "
          f"{chunk_mib:g} MiB (was {len(manifest['chunks'])})", flush=True)
    return new
