"""Engine settings: resolving what the user asked for into one concrete, comparable record.

A setting can come from four places, and the first that gives it wins:

1. an explicit argument of ``workbench.load(...)``;
2. the environment variables of Llama Stack's meta-reference distribution (``INFERENCE_MODEL``,
   ``INFERENCE_CHECKPOINT_DIR``, ``MODEL_PARALLEL_SIZE``, ``MAX_BATCH_SIZE``, ``MAX_SEQ_LEN``,
   ``QUANTIZATION_TYPE``), so a notebook started inside such a deployment loads what the server would;
3. a named entry of a ``checkpoints.toml`` (``workbench.load("scout")``, or the file's ``default``);
4. the embedded default (the trained tiny Llama 4 demo model that calls tools, CPU).

Every value remembers where it came from, so an error can say "max_seq_len='8k' (from environment
variable MAX_SEQ_LEN) must be a positive integer; fix or unset MAX_SEQ_LEN" instead of leaving the
user to guess which of the four layers is wrong.  :func:`check_settings` then checks the checkpoint
folder against the settings (files present, shard count and head counts fit the model-parallel
size, enough GPUs) *before* anything heavy starts.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from workbench.checkpoints.files import shard_paths, source_shards_for_rank
from workbench.checkpoints.preflight import check_memory
from workbench.checkpoints.validate import check_checkpoint
from workbench.demo.artifact import DEFAULT_MODEL_NAME, default_checkpoint_dir
from workbench.errors import CheckpointError, ConfigError, InputError, MissingCheckpointFileError, WorkbenchError
from workbench.formats.models import resolve_model
from workbench.models.args import ModelArgs
from workbench.runtime.settings import (
    ARGUMENT,
    DEFAULT,
    Settings,
    Source,
    check_flag,
    check_positive_int,
    check_quantization,
    resolve_device,
    resolve_dtype,
    setting_problem,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_MODEL_PARALLEL_SIZE = 1
CONFIG_FILE_NAME = "checkpoints.toml"

# load() keyword -> Llama Stack meta-reference environment variable.
ENV_VARS: dict[str, str] = {
    "checkpoint": "INFERENCE_CHECKPOINT_DIR",
    "model": "INFERENCE_MODEL",
    "model_parallel_size": "MODEL_PARALLEL_SIZE",
    "max_batch_size": "MAX_BATCH_SIZE",
    "max_seq_len": "MAX_SEQ_LEN",
    "quantization": "QUANTIZATION_TYPE",
    "batch_invariant": "WORKBENCH_BATCH_INVARIANT",
}

# Keys of a checkpoints.toml entry and their TOML types (keep checkpoints.example.toml in sync).
ENTRY_KEYS: dict[str, type] = {
    "path": str,
    "model": str,
    "model_parallel_size": int,
    "max_batch_size": int,
    "max_seq_len": int,
    "quantization": str,
    "device": str,
    "dtype": str,
    "batch_invariant": bool,
}
_ENTRY_TO_ARG = {"path": "checkpoint"}


def check_model_id(model_id: str, source: Source = ARGUMENT) -> str:
    """The model name must tell the prompt format (checked at load, not at the first chat call)."""
    try:
        resolve_model(model_id)
    except InputError as exc:
        raise setting_problem("model", model_id, source, f"is not a model name workbench knows ({exc})") from None
    return model_id


# --------------------------------------------------------------------------------------------- checkpoints.toml
@dataclass(frozen=True)
class ConfigFile:
    """One parsed checkpoints.toml: its named entries and optional ``default = "name"``."""

    path: Path
    entries: dict[str, dict[str, Any]]
    default: str | None

    @classmethod
    def read(cls, path: Path) -> ConfigFile:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid TOML ({exc}); fix the syntax (see checkpoints.example.toml)"
            ) from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path} is not a UTF-8 text file ({exc.reason} at byte {exc.start}); a checkpoints.toml "
                "must be TOML text (see checkpoints.example.toml)"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"cannot read {path} ({exc}); check its permissions") from exc
        entries: dict[str, dict[str, Any]] = {}
        default = None
        for key, value in data.items():
            if key == "default":
                if not isinstance(value, str):
                    raise ConfigError(
                        f"{path}: top-level `default` must be the name of an entry, e.g. default = "
                        f'"scout", got {value!r}'
                    )
                default = value
            elif isinstance(value, dict):
                entries[key] = value
            else:
                raise ConfigError(
                    f"{path}: top-level key {key!r} is neither an entry table nor `default`; put settings under a "
                    f"[name] header (see checkpoints.example.toml)"
                )
        if default is not None and default not in entries:
            raise ConfigError(f"{path}: default = {default!r} names no entry; entries are {sorted(entries)}")
        return cls(path, entries, default)


def user_config_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/workbench`` or ``~/.config/workbench``."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "workbench"


def config_file_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    """checkpoints.toml files that exist, highest precedence first: ``$WORKBENCH_CHECKPOINTS`` (a file or
    a folder holding one), the working folder, the user config folder."""
    environ = os.environ if environ is None else environ
    paths: list[Path] = []
    named = environ.get("WORKBENCH_CHECKPOINTS")
    if named:
        path = Path(named).expanduser()
        if path.is_dir():
            path = path / CONFIG_FILE_NAME
        if not path.is_file():
            raise ConfigError(
                f"WORKBENCH_CHECKPOINTS={named!r} (from environment variable WORKBENCH_CHECKPOINTS) names no "
                f"checkpoints.toml; create it (copy checkpoints.example.toml) or unset the variable"
            )
        paths.append(path)
    for candidate in (Path.cwd() / CONFIG_FILE_NAME, user_config_dir(environ) / CONFIG_FILE_NAME):
        if candidate.is_file() and all(candidate.resolve() != p.resolve() for p in paths):
            paths.append(candidate)
    return paths


class Catalog:
    """The named entries of every checkpoints.toml found, looked up in precedence order."""

    def __init__(self, files: Sequence[ConfigFile]) -> None:
        self.files = list(files)

    @classmethod
    def discover(cls, environ: Mapping[str, str] | None = None) -> Catalog:
        return cls([ConfigFile.read(p) for p in config_file_paths(environ)])

    def names(self) -> list[str]:
        return sorted({name for f in self.files for name in f.entries})

    def find(self, name: str) -> tuple[dict[str, Any], ConfigFile] | None:
        for f in self.files:
            if name in f.entries:
                return f.entries[name], f
        return None

    def default(self) -> tuple[str, dict[str, Any], ConfigFile] | None:
        for f in self.files:
            if f.default is not None:
                return f.default, f.entries[f.default], f
        return None

    def where(self) -> str:
        if not self.files:
            return (
                "no checkpoints.toml was found (looked at $WORKBENCH_CHECKPOINTS, ./checkpoints.toml and "
                "~/.config/workbench/checkpoints.toml)"
            )
        return "checkpoints.toml files read: " + ", ".join(str(f.path) for f in self.files)


def check_entry(name: str, entry: dict[str, Any], path: Path) -> dict[str, tuple[Any, Source]]:
    """Validate one entry's keys and TOML types; returns ``load()`` keyword -> (value, source)."""
    where = f"[{name}] in {path}"
    out: dict[str, tuple[Any, Source]] = {}
    for key, value in entry.items():
        if key not in ENTRY_KEYS:
            close = difflib.get_close_matches(key, ENTRY_KEYS, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            if isinstance(value, dict):
                hint += (
                    f"(a dotted header like [{name}.{key}] makes a nested table: quote the entry name, "
                    f'["{name}.{key}"]) '
                )
            raise ConfigError(
                f"checkpoints.toml entry {where}: unknown key {key!r}; {hint}allowed keys are {', '.join(ENTRY_KEYS)}"
            )
        want = ENTRY_KEYS[key]
        if (isinstance(value, bool) and want is not bool) or not isinstance(value, want):
            example = {str: '"..."', int: "4096", bool: "true"}[want]
            kind = {str: "string", int: "integer", bool: "boolean"}[want]
            raise ConfigError(
                f"checkpoints.toml entry {where}: {key} = {value!r} must be a TOML {kind}; "
                f"write it like `{key} = {example}`"
            )
        source = Source("file", where)
        if key == "path":
            folder = Path(value).expanduser()
            value = folder if folder.is_absolute() else path.parent / folder  # relative to the toml file
        out[_ENTRY_TO_ARG.get(key, key)] = (value, source)
    if "checkpoint" not in out:
        raise ConfigError(f'checkpoints.toml entry {where} has no `path`; add path = "/folder/with/params.json"')
    return out


# --------------------------------------------------------------------------------------------- resolution
LOAD_SETTINGS = (
    "checkpoint",
    "model",
    "device",
    "dtype",
    "max_batch_size",
    "max_seq_len",
    "model_parallel_size",
    "quantization",
    "batch_invariant",
)


def unknown_setting_error(name: str) -> ConfigError:
    """A ``load()`` keyword that is not a setting: name the closest one (a typo would otherwise be ignored)."""
    close = difflib.get_close_matches(name, LOAD_SETTINGS, n=1)
    hint = f"did you mean {close[0]}=? " if close else ""
    return ConfigError(
        f"{name}= (from argument) is not a setting of workbench.load(); {hint}settings are {', '.join(LOAD_SETTINGS)}"
    )


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    """An environment value, with Llama Stack's unset spellings ('' and 'null') treated as unset."""
    value = environ.get(ENV_VARS[name])
    if value is None or value.strip() in ("", "null", "None"):
        return None
    return value.strip()


def _looks_like_path(text: str) -> bool:
    """Path syntax (a separator, ``.``, ``~``): never an entry name."""
    return any(sep in text for sep in ("/", "\\", os.sep)) or text.startswith((".", "~"))


def resolve_settings(
    checkpoint: str | Path | None = None,
    *,
    model: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    model_parallel_size: int | None = None,
    quantization: str | None = None,
    batch_invariant: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Turn ``load`` arguments into concrete Settings: arguments, then environment, then checkpoints.toml,
    then defaults.  ``checkpoint`` is a folder or the name of a checkpoints.toml entry.

    Nothing heavy happens here (no checkpoint is opened; the embedded default model is written on
    first use); :func:`check_settings` checks the folder.  ``quantization=None`` means "not given";
    pass ``quantization="none"`` to override a quantized entry or ``QUANTIZATION_TYPE``.
    """
    environ = os.environ if environ is None else environ
    args: dict[str, Any] = {
        "model": model,
        "device": device,
        "dtype": dtype,
        "max_batch_size": max_batch_size,
        "max_seq_len": max_seq_len,
        "model_parallel_size": model_parallel_size,
        "quantization": quantization,
        "batch_invariant": batch_invariant,
    }
    chosen, entry = _choose_checkpoint(checkpoint, environ)

    def pick(name: str) -> tuple[Any, Source]:
        return _pick(name, args.get(name), environ, entry)

    sources: dict[str, Source] = {}
    if chosen is None:
        chosen = (default_checkpoint_dir(), Source("default", DEFAULT_MODEL_NAME))  # the engine shows this name
    folder, sources["checkpoint"] = chosen
    model_id, sources["model"] = pick("model")
    if model_id is not None and (not isinstance(model_id, str) or not model_id.strip()):
        raise setting_problem(
            "model", model_id, sources["model"], "must be a model name such as 'Llama3.2-3B-Instruct'"
        )
    if model_id is not None:
        check_model_id(model_id, sources["model"])
    raw_device, sources["device"] = pick("device")
    dev = resolve_device(raw_device, sources["device"])
    raw_dtype, sources["dtype"] = pick("dtype")
    ints: dict[str, int] = {}
    for name, fallback in (
        ("max_batch_size", DEFAULT_MAX_BATCH_SIZE),
        ("max_seq_len", DEFAULT_MAX_SEQ_LEN),
        ("model_parallel_size", DEFAULT_MODEL_PARALLEL_SIZE),
    ):
        value, sources[name] = pick(name)
        ints[name] = (
            fallback
            if value is None
            else check_positive_int(value, name, sources[name], allow_zero=name == "model_parallel_size")
        )
    raw_quant, sources["quantization"] = pick("quantization")
    quant = check_quantization(raw_quant, "quantization", sources["quantization"])
    raw_invariant, sources["batch_invariant"] = pick("batch_invariant")
    invariant = raw_invariant is not None and check_flag(raw_invariant, "batch_invariant", sources["batch_invariant"])
    return Settings(
        checkpoint_dir=Path(folder).expanduser().resolve(),
        model_id=model_id,
        device=dev,
        dtype=resolve_dtype(raw_dtype, dev, sources["dtype"], quantization=quant),
        max_batch_size=ints["max_batch_size"],
        max_seq_len=ints["max_seq_len"],
        model_parallel_size=ints["model_parallel_size"],
        quantization=quant,
        batch_invariant=invariant,
        sources=sources,
    )


def _choose_checkpoint(
    checkpoint: str | Path | None, environ: Mapping[str, str]
) -> tuple[tuple[Any, Source] | None, dict[str, tuple[Any, Source]]]:
    """The checkpoint folder asked for and where it came from (None: the embedded default), and the settings of
    its checkpoints.toml entry when it is one."""
    entry: dict[str, tuple[Any, Source]] = {}
    chosen: tuple[Any, Source] | None = None
    if isinstance(checkpoint, Path):
        chosen = (checkpoint, ARGUMENT)
    elif isinstance(checkpoint, str):
        if not checkpoint.strip():
            raise setting_problem("checkpoint", checkpoint, ARGUMENT, "is empty: give a folder or an entry name")
        catalog = None if _looks_like_path(checkpoint) else Catalog.discover(environ)
        found = catalog.find(checkpoint) if catalog is not None else None
        if found is not None:  # an entry name wins over a same-named folder in the working folder
            entry = check_entry(checkpoint, found[0], found[1].path)
            chosen = entry.pop("checkpoint")
        elif catalog is not None and not Path(checkpoint).exists():
            known = catalog.names()
            close = difflib.get_close_matches(checkpoint, known, n=1)
            raise ConfigError(
                f"checkpoint={checkpoint!r} (from argument) is neither a folder nor a checkpoints.toml entry"
                f"{f'; did you mean {close[0]!r}' if close else ''}; known entries: {known or 'none'} "
                f"({catalog.where()}). Pass a folder path, or add [{checkpoint}] to a checkpoints.toml "
                "(see checkpoints.example.toml)"
            )
        else:
            chosen = (checkpoint, ARGUMENT)
    elif checkpoint is not None:
        raise setting_problem("checkpoint", checkpoint, ARGUMENT, "must be a folder path or an entry name (a string)")
    elif (env_dir := _env_value(environ, "checkpoint")) is not None:
        chosen = (env_dir, Source("environment", ENV_VARS["checkpoint"]))
    else:
        default = Catalog.discover(environ).default()
        if default is not None:
            name, raw, file = default
            entry = check_entry(name, raw, file.path)
            chosen = entry.pop("checkpoint")
    return chosen, entry


def _pick(
    name: str, argument: Any, environ: Mapping[str, str], entry: dict[str, tuple[Any, Source]]
) -> tuple[Any, Source]:
    """A setting's value and source: the argument, else the environment, else the entry, else (None, default)."""
    if argument is not None:
        return argument, ARGUMENT
    if name in ENV_VARS and (value := _env_value(environ, name)) is not None:
        return value, Source("environment", ENV_VARS[name])
    if name in entry:
        return entry[name]
    return None, DEFAULT


def resolve_model_parallel_size(
    checkpoint: str | Path | None = None,
    model_parallel_size: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The model-parallel size ``workbench.load(checkpoint, model_parallel_size=...)`` resolves to (argument,
    then ``MODEL_PARALLEL_SIZE``, then the checkpoints.toml entry, then 1; 0 means one rank per shard of the
    checkpoint), for whoever places the ranks before anything loads (the Ray pool reserves GPUs per replica)."""
    environ = os.environ if environ is None else environ
    chosen, entry = _choose_checkpoint(checkpoint, environ)
    value, source = _pick("model_parallel_size", model_parallel_size, environ, entry)
    mp = (
        DEFAULT_MODEL_PARALLEL_SIZE
        if value is None
        else check_positive_int(value, "model_parallel_size", source, allow_zero=True)
    )
    if mp == 0:  # one rank per saved shard
        folder = Path(chosen[0] if chosen is not None else default_checkpoint_dir()).expanduser()
        mp = len(list(folder.glob("consolidated.*.pth")))
        if mp == 0:
            raise setting_problem(
                "model_parallel_size",
                0,
                source,
                f"means one rank per shard, and {str(folder)!r} holds no consolidated.NN.pth",
            )
    return mp


# --------------------------------------------------------------------------------------------- checkpoint checks
def check_folder(folder: Path) -> None:
    """The checkpoint path must be an existing folder; a file is named as a file, not as missing."""
    if folder.is_dir():
        return
    if folder.exists():
        raise CheckpointError(
            "this path is a file, not a folder; give the folder that holds params.json, "
            "consolidated.NN.pth and tokenizer.model"
        )
    raise MissingCheckpointFileError("the folder does not exist")


def _relative(message: str, folder: Path) -> str:
    """``message`` with paths inside ``folder`` shortened to their file names (the caller names the folder)."""
    return message.replace(f"{folder}{os.sep}", "").replace(f"{folder}: ", "")


def check_settings(settings: Settings, *, reclaimable_bytes: int = 0) -> Settings:
    """Check the checkpoint folder against the settings before anything is loaded or spawned.

    Reads ``params.json``, the folder listing and shard 0's tensor shapes (memory-mapped: no weights), checks
    the shapes against params.json and that weights + KV cache fit the device (``reclaimable_bytes``: memory
    of an engine that is freed before this one loads).  Replaces ``model_parallel_size=0`` ("auto",
    Llama Stack's meaning) by the shard count.  Errors keep their checkpoint-error type and add which
    setting, from where, and the fix.
    """
    ckpt_src = settings.source("checkpoint")
    where = f"checkpoint {str(settings.checkpoint_dir)!r} (from {ckpt_src.describe()})"
    try:
        check_folder(settings.checkpoint_dir)
        args = ModelArgs.from_checkpoint(settings.checkpoint_dir)
        n_shards = len(shard_paths(settings.checkpoint_dir))
    except WorkbenchError as exc:
        raise type(exc)(
            f"{where}: {_relative(str(exc), settings.checkpoint_dir)}; {ckpt_src.fix('checkpoint')}"
        ) from exc

    mp = settings.model_parallel_size or n_shards
    if settings.model_parallel_size == 0:
        settings = replace(settings, model_parallel_size=mp)
    mp_src = settings.source("model_parallel_size")

    def misfit(what: str) -> ConfigError:
        return setting_problem("model_parallel_size", mp, mp_src, f"does not fit {where}: {what}")

    try:
        source_shards_for_rank(n_shards, mp, 0)
    except CheckpointError as exc:
        raise misfit(str(exc)) from exc
    if args.n_heads % mp:
        raise misfit(f"n_heads={args.n_heads} is not divisible by it")
    kv = args.kv_heads
    if kv % mp and mp % kv:
        raise misfit(f"n_kv_heads={kv} neither divides it nor is a multiple of it")
    if args.vocab_size > 0 and args.vocab_size % mp:
        raise misfit(f"vocab_size={args.vocab_size} is not divisible by it")
    hidden = [("dense feed-forward size", args.dense_hidden_dim())]
    if args.moe_args is not None:
        hidden.append(("expert feed-forward size", args.moe_hidden_dim()))
    for label, size in hidden:
        if size % mp:
            raise misfit(f"the {label} {size} is not divisible by it")
    if settings.device.startswith("cuda") and mp > 1:
        if settings.device != "cuda":
            raise setting_problem(
                "device",
                settings.device,
                settings.source("device"),
                f"names one GPU but model_parallel_size={mp} uses GPUs 0..{mp - 1} (one per rank): "
                "use device='cuda' and CUDA_VISIBLE_DEVICES to choose the GPUs",
            )
        if torch.cuda.device_count() < mp:
            raise misfit(f"only {torch.cuda.device_count()} GPU(s) are visible and each rank needs its own")
    try:
        check_checkpoint(settings.checkpoint_dir, args)
    except WorkbenchError as exc:
        raise type(exc)(f"{where}: {_relative(str(exc), settings.checkpoint_dir)}") from exc
    check_memory(settings, args, reclaimable_bytes=reclaimable_bytes)
    return settings
