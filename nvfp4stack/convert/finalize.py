"""The last step of a convert: shards renamed to their final names, index, side files, config,
report and manifest written, then the temporary output renamed into place.

It is journaled like the shards: a kill anywhere in it leaves every shard for the rerun
(``journal.read_journal`` takes the renames back).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import file_sha256, shard_name, write_index
from nvfp4stack.checkpoint.side_files import copy_side_files
from nvfp4stack.convert.destination import MANIFEST, REPORT, put_in_place
from nvfp4stack.convert.journal import JOURNAL, append_journal, journal_entries


def finalize(dst: Path, tmp: Path, replace: bool, side: list[Path], unknown: list[str], reports: dict,
             config: dict | None, hf_quant_config: dict | None, digest: str) -> dict:
    """Complete ``tmp`` (every shard already closed and journaled), put it at ``dst``; returns the report."""
    entries = journal_entries(tmp)
    n = len(entries)
    append_journal(tmp, {"finalize": n})
    weight_map, total = {}, 0
    for i, e in enumerate(entries):
        final = shard_name(i, n)
        os.replace(tmp / e["file"], tmp / final)
        weight_map.update({name: final for name in e["names"]})
        total += e["size"]
    write_index(tmp, weight_map, total)
    # tokenizer, generation config, license...: the allow-listed side files travel with the weights
    copy_side_files([p for p in side if p.name != "config.json" or config is None], tmp)
    if config is not None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if hf_quant_config:
        (tmp / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=2, sort_keys=True) + "\n")
    report = {"unknown_tensors": unknown, "converters": dict(sorted(reports.items())),
              "shards": n, "total_bytes": total, "plan_digest": digest}
    (tmp / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    shas = {e["file"]: e["sha256"] for e in entries}
    manifest = {shard_name(i, n): shas[e["file"]] for i, e in enumerate(entries)}
    for p in sorted(tmp.iterdir()):
        if p.name not in manifest and p.name != JOURNAL:
            manifest[p.name] = file_sha256(p)
    (tmp / MANIFEST).write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    (tmp / JOURNAL).unlink()
    put_in_place(tmp, dst, replace)
    return report
