"""The checkpoint directory a config key names, checked where it is first used."""
from __future__ import annotations

from pathlib import Path


def checkpoint_dir(key: str, value: str, *, needs_config: bool = True) -> Path:
    """``value`` (the setting of config key ``key``) as a directory, holding config.json when
    ``needs_config``. Raises FileNotFoundError naming the key, the value and the fix, so a person
    never has to guess which setting an ``[Errno 2] .../config.json`` came from."""
    path = Path(value).expanduser()
    if not path.exists():
        problem = "no such directory"
    elif not path.is_dir():
        problem = "a file, not a directory"
    elif needs_config and not (path / "config.json").is_file():
        problem = "a directory without config.json"
    else:
        return path
    held = " holding config.json" if needs_config else ""
    raise FileNotFoundError(f"{key}={value!r}: {problem}; expected a checkpoint directory{held}. "
                            f"Fix: set {key}=<checkpoint dir>")
