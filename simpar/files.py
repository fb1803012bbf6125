"""Writing output files: to a temporary name in the same folder, then renamed, so nothing is half-written."""

from __future__ import annotations

import json
import os
import tempfile


def atomic_write(path: str, write) -> None:
    """Call write(tmp_path) and rename the result to `path`; on failure nothing is left behind."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def write_json(path: str, data) -> None:
    write_text(path, json.dumps(data, indent=1))
