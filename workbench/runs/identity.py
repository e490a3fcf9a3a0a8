"""A checkpoint's content identity: what a stored row's key says about the weights that produced it.

The identity hashes the content of every file the loader reads — ``params.json``, the tokenizer files and
every weight file (``consolidated.NN.pth``, prequantized scale files) — so a re-downloaded, re-exported or
edited-in-place checkpoint is a different checkpoint even at the same path, and a copy at another path is
the same one.  Content hashes are expensive (a 200 GB checkpoint reads 200 GB), so each file's sha256 is
remembered in the run store by path, size, mtime, ctime and inode: the checkpoint is hashed once, and a file
rewritten in place (any of those change) is hashed again.  Files are hashed in chunks, several files at
once (the hash releases the GIL), with a progress bar on long reads.

The embedded demo model is identified by its shipped artifact's hash (its folder is a deterministic
expansion of the artifact), so its ~160 MB expansion is never read.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from workbench.demo.artifact import ARTIFACT, DEFAULT_MODEL_VERSION
from workbench.errors import InputError
from workbench.progress import progress_bar

CHUNK_BYTES = 8 << 20
# The files of a checkpoint folder that decide its numbers (checklist.chk, LICENSE, README are not read).
_READ_SUFFIXES = (".pth", ".pt", ".safetensors")


@dataclass(frozen=True)
class FileStat:
    """What decides whether a remembered hash is still the file's: any change means hash again."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, path: str | Path) -> FileStat:
        real = os.path.realpath(path)
        st = os.stat(real)
        return cls(real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass(frozen=True)
class CheckpointIdentity:
    """``digest`` (the identity a key carries: ``sha256:<hex>`` over the files' names and hashes, or
    ``demo:<hex>``), the checkpoint ``path`` and each file's sha256 (``files``)."""

    digest: str
    path: str
    files: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.digest


# A memo of file hashes: the run store's file_hashes table (or a dict in tests and read-only stores).
Lookup = Callable[[FileStat], "str | None"]
Remember = Callable[[FileStat, str], None]


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The files of ``folder`` that the loader reads, sorted by name: params.json, tokenizer files and weight
    files (``*.pth``, ``*.pt``, ``*.safetensors``) at the top level."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(
            f"checkpoint folder {folder} does not exist or is not a folder; give the folder that holds "
            "params.json and the consolidated.NN.pth shards"
        )
    chosen = [
        p
        for p in folder.iterdir()
        if p.is_file() and (p.name == "params.json" or p.name.startswith("tokenizer") or p.suffix in _READ_SUFFIXES)
    ]
    return sorted(chosen, key=lambda p: p.name)


def file_sha256(path: str | Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """The sha256 of a file's content, read in :data:`CHUNK_BYTES` chunks (memory stays flat)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def hash_files(
    paths: Iterable[str | Path],
    *,
    lookup: Lookup | None = None,
    remember: Remember | None = None,
    progress: bool | None = None,
) -> dict[str, str]:
    """sha256 of each file (by real path), reusing remembered hashes whose stat still matches; new hashes
    are remembered unless the file changed while it was read."""
    stats = [FileStat.of(p) for p in paths]
    known = {s.path: lookup(s) if lookup is not None else None for s in stats}
    todo = [s for s in stats if known[s.path] is None]
    if todo:
        total = sum(s.size for s in todo)
        lock = threading.Lock()
        with progress_bar(total, desc="hashing checkpoint", unit="B", progress=progress) as bar:

            def advance(n: int) -> None:
                with lock:
                    bar.update(n)

            def one(stat: FileStat) -> tuple[FileStat, str]:
                return stat, file_sha256(stat.path, advance)

            workers = max(1, min(len(todo), os.cpu_count() or 1, 8))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for stat, digest in pool.map(one, todo):
                    known[stat.path] = digest
                    if remember is not None and FileStat.of(stat.path) == stat:
                        remember(stat, digest)
    return {s.path: known[s.path] for s in stats}  # type: ignore[misc]


def checkpoint_identity(
    folder: str | Path,
    *,
    lookup: Lookup | None = None,
    remember: Remember | None = None,
    extra_files: Iterable[str | Path] = (),
    progress: bool | None = None,
) -> CheckpointIdentity:
    """The content identity of the checkpoint in ``folder`` (see the module docstring).  ``extra_files``:
    files the engine reads from elsewhere (a bundled tokenizer); ``lookup`` / ``remember``: the hash memo
    (:meth:`workbench.runs.Store.checkpoint_identity` passes the store's)."""
    folder = Path(folder)
    if folder.name.startswith(f"{DEFAULT_MODEL_VERSION}-") and ARTIFACT.is_file():
        # the demo model's expansion is named by the artifact's hash: same name, same weights
        artifact = next(iter(hash_files([ARTIFACT], lookup=lookup, remember=remember, progress=progress).values()))
        if folder.name == f"{DEFAULT_MODEL_VERSION}-{artifact[:12]}":
            manifest = {"artifact": artifact, "version": DEFAULT_MODEL_VERSION}
            ident = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
            return CheckpointIdentity(f"demo:{ident}", str(folder), {ARTIFACT.name: artifact})
    files = checkpoint_files(folder)
    if not any(p.name == "params.json" for p in files):
        raise InputError(
            f"{folder} has no params.json, so it is not a Meta checkpoint folder; give the folder that "
            "holds params.json and the consolidated.NN.pth shards"
        )
    extra = [Path(p) for p in extra_files]
    digests = hash_files([*files, *extra], lookup=lookup, remember=remember, progress=progress)
    names: dict[str, str] = {}
    for p in files:
        names[p.name] = digests[os.path.realpath(p)]
    for p in extra:
        names[f"extra:{p.name}"] = digests[os.path.realpath(p)]
    ident = hashlib.sha256(json.dumps(names, sort_keys=True).encode()).hexdigest()
    return CheckpointIdentity(f"sha256:{ident}", str(folder), names)
