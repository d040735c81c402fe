"""A JSON file the user named on the command line (a model's `config.json`, a GPU, a fitted profile), read with
one rule: a file that cannot be read or is not JSON is a ValueError that names the file and what it was for."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_json"]


def read_json(path: str | Path, what: str):
    """The parsed contents of `path`; `what` names the file in errors ("model config", "GPU file", "profile")."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r} is not JSON: {exc}") from None
