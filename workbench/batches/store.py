"""Files and batch records on disk, so that both survive a server restart.

Layout under the data folder (:func:`default_data_dir`, or ``--data-dir``)::

    files/<file id>          the bytes (an uploaded batch input, or a batch's output / error file)
    files/<file id>.json     OpenAI's File object
    batches/<batch id>.json  the batch record (OpenAI's Batch object plus the runner's own fields)
    batches/<batch id>/      the batch's work: ``done.jsonl`` (every answered line, appended as chunks finish)
                             and ``lock`` (held while a process runs the batch)

Every record is written whole to a temporary file and renamed over the old one, so a killed process leaves
either the old record or the new one, never half of one.  Ids are checked against their pattern before they
become paths: an id from a URL never reaches outside the folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from workbench.places import data_dir

from .errors import BatchAPIError, not_found

PURPOSES = ("batch",)  # what clients may upload here (outputs are written as "batch_output")
_ID = re.compile(r"^(file-|batch_)[0-9a-f]{24}$")  # OpenAI's spellings: file-..., batch_...
_SEP = {"file": "-", "batch": "_"}


def default_data_dir() -> Path:
    """Where files and batches live: workbench's data folder (:func:`workbench.places.data_dir`:
    ``$WORKBENCH_DATA_DIR``, else ``$XDG_DATA_HOME/workbench``, by default ``~/.local/share/workbench``), which
    the run store shares."""
    return data_dir()


def new_id(kind: str) -> str:
    """A fresh id: ``file-<24 hex>`` or ``batch_<24 hex>``."""
    return f"{kind}{_SEP[kind]}{uuid.uuid4().hex[:24]}"


def checked_id(kind: str, ident: Any) -> str:
    """``ident`` when it is a well-formed id of ``kind`` (else the 404 of an unknown one): safe as a file name."""
    if not isinstance(ident, str) or not _ID.match(ident) or not ident.startswith(kind + _SEP[kind]):
        raise not_found(kind, str(ident))
    return ident


def write_json(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class FileStore:
    """OpenAI's files: uploads (``purpose="batch"``) and the outputs batches write (``"batch_output"``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root) / "files"

    def _dir(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def create(self, data: bytes | BinaryIO, *, filename: str, purpose: str) -> dict[str, Any]:
        """Store ``data`` (bytes or a binary file object, copied in chunks) and return its File object."""
        if purpose not in PURPOSES:
            raise BatchAPIError(
                f"purpose {purpose!r:.40} is not stored here: this server keeps files for the Batch "
                "API only (purpose 'batch')",
                param="purpose",
            )
        file_id = new_id("file")
        tmp = self._dir() / f".{file_id}.part"
        with open(tmp, "wb") as f:
            if isinstance(data, (bytes, bytearray)):
                f.write(data)
            else:
                shutil.copyfileobj(data, f, 1 << 20)
            f.flush()
            os.fsync(f.fileno())
        return self._adopt(tmp, file_id, filename=filename, purpose=purpose)

    def adopt(self, path: Path, *, filename: str, purpose: str, file_id: str | None = None) -> dict[str, Any]:
        """Move a finished file (a batch's output) into the store, under ``file_id`` when given (a rerun of the
        same step then replaces the file instead of leaving a copy); returns its File object."""
        return self._adopt(
            path, checked_id("file", file_id) if file_id else new_id("file"), filename=filename, purpose=purpose
        )

    def _adopt(self, path: Path, file_id: str, *, filename: str, purpose: str) -> dict[str, Any]:
        info = {
            "id": file_id,
            "object": "file",
            "bytes": path.stat().st_size,
            "created_at": int(time.time()),
            "filename": str(filename)[:255] or "upload.jsonl",
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        os.replace(path, self._dir() / file_id)
        write_json(self._dir() / f"{file_id}.json", info)
        return info

    def get(self, file_id: Any) -> dict[str, Any]:
        file_id = checked_id("file", file_id)
        meta = self.root / f"{file_id}.json"
        if not meta.exists() or not (self.root / file_id).exists():
            raise not_found("file", file_id)
        return read_json(meta)

    def path(self, file_id: Any) -> Path:
        """The file's bytes on disk (checked to exist)."""
        self.get(file_id)
        return self.root / file_id

    def delete(self, file_id: Any) -> dict[str, Any]:
        info = self.get(file_id)
        (self.root / f"{info['id']}.json").unlink(missing_ok=True)
        (self.root / info["id"]).unlink(missing_ok=True)
        return {"id": info["id"], "object": "file", "deleted": True}

    def list(
        self, *, purpose: str | None = None, limit: int = 10000, after: str | None = None, order: str = "desc"
    ) -> tuple[list[dict[str, Any]], bool]:
        """File objects, newest first (``order="asc"``: oldest first), after the id ``after``; and whether more
        remain."""
        infos = [info for info in _records(self.root.glob("file-*.json")) if purpose in (None, info["purpose"])]
        return _page(infos, limit=limit, after=after, order=order)


class BatchRecords:
    """Batch records: one JSON file per batch, and a work folder beside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root) / "batches"

    def work_dir(self, batch_id: str) -> Path:
        folder = self.root / checked_id("batch", batch_id)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def save(self, record: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.root / f"{checked_id('batch', record['id'])}.json", record)

    def load(self, batch_id: Any) -> dict[str, Any]:
        path = self.root / f"{checked_id('batch', batch_id)}.json"
        if not path.exists():
            raise not_found("batch", batch_id)
        return read_json(path)

    def all(self) -> list[dict[str, Any]]:
        """Every record, oldest first."""
        return sorted(_records(self.root.glob("batch_*.json")), key=lambda r: (r["created_at"], r["id"]))


def _records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        try:
            out.append(read_json(path))
        except (OSError, ValueError):  # removed meanwhile, or not ours: skipped, never a 500
            continue
    return out


def _page(items: list[dict[str, Any]], *, limit: int, after: str | None, order: str) -> tuple[list[dict], bool]:
    if order not in ("asc", "desc"):
        raise BatchAPIError(f"order must be 'asc' or 'desc', got {order!r:.20}", param="order")
    items = sorted(items, key=lambda r: (r["created_at"], r["id"]), reverse=order == "desc")
    if after is not None:
        ids = [r["id"] for r in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return items[:limit], len(items) > limit
