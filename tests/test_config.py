"""Settings resolution: precedence (arguments > Llama Stack env vars > checkpoints.toml > default) and
every bad setting, each error naming the setting, where it came from and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from workbench.checkpoints.factory import TINY_LLAMA3
from workbench.config import (
    ENTRY_KEYS,
    ENV_VARS,
    Catalog,
    ConfigFile,
    check_entry,
    check_settings,
    resolve_settings,
)
from workbench.demo.artifact import default_checkpoint_dir
from workbench.errors import ConfigError, MissingCheckpointFileError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Llama Stack variables, no checkpoints.toml from the host: a working folder and config home of our own."""
    for var in (*ENV_VARS.values(), "WORKBENCH_CHECKPOINTS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "config-home"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def write_toml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_checkpoint(folder: Path, params: dict, n_shards: int = 1) -> Path:
    """params.json plus empty shard files: enough for check_settings, which never opens a shard."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.json").write_text(json.dumps(params))
    for i in range(n_shards):
        (folder / f"consolidated.{i:02d}.pth").write_bytes(b"")
    return folder


# --------------------------------------------------------------------------------------------- precedence
def test_embedded_default_when_nothing_is_given():
    s = resolve_settings()
    assert s.checkpoint_dir == default_checkpoint_dir().resolve()
    assert (s.model_id, s.model_parallel_size, s.quantization) == (None, 1, None)
    assert (s.max_batch_size, s.max_seq_len) == (16, 2048)
    assert s.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert {src.kind for src in s.sources.values()} == {"default"}


def test_a_quantization_mode_stores_the_rest_in_bf16_unless_a_dtype_is_asked_for():
    plain = resolve_settings(device="cpu")
    assert plain.dtype == torch.float32  # the CPU default without quantization
    assert resolve_settings(device="cpu", quantization="int4_mixed").dtype == torch.bfloat16
    assert resolve_settings(device="cpu", quantization="fp8_mixed", dtype="float32").dtype == torch.float32
    toggled = plain.with_quantization("fp8_mixed")  # engine.set_quantization on a default-loaded engine
    assert toggled.dtype == torch.bfloat16 and toggled.sources["dtype"].kind == "default"
    assert toggled.with_quantization(None) == plain
    explicit = resolve_settings(device="cpu", dtype="float32")
    assert explicit.with_quantization("int4_mixed").dtype == torch.float32


def test_each_field_arguments_then_env_then_file_then_default(monkeypatch, clean_env, llama3_dir, tmp_path):
    other = tmp_path / "other-ckpt"
    write_toml(
        clean_env / "checkpoints.toml",
        f"""
default = "tiny"
[tiny]
path = "{llama3_dir}"
model = "Llama3.2-3B-Instruct"
model_parallel_size = 2
max_batch_size = 3
max_seq_len = 128
quantization = "int4_mixed"
dtype = "bfloat16"
""",
    )
    env = {
        "INFERENCE_CHECKPOINT_DIR": str(other),
        "INFERENCE_MODEL": "Llama3.1-8B-Instruct",
        "MODEL_PARALLEL_SIZE": "4",
        "MAX_BATCH_SIZE": "5",
        "MAX_SEQ_LEN": "256",
        "QUANTIZATION_TYPE": "fp8_mixed",
    }
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    explicit = dict(
        model="Llama-4-Scout-17B-16E-Instruct",
        model_parallel_size=8,
        max_batch_size=7,
        max_seq_len=512,
        quantization="bf16",
        dtype="float16",
        device="cpu",
        batch_invariant=True,
    )
    s = resolve_settings(tmp_path / "arg-ckpt", **explicit)
    assert s.batch_invariant is True
    assert (
        s.checkpoint_dir,
        s.model_id,
        s.model_parallel_size,
        s.max_batch_size,
        s.max_seq_len,
        s.quantization,
        s.dtype,
    ) == (tmp_path / "arg-ckpt", "Llama-4-Scout-17B-16E-Instruct", 8, 7, 512, "bf16", torch.float16)
    assert {src.kind for src in s.sources.values()} == {"argument"}

    s = resolve_settings()  # environment
    assert (s.checkpoint_dir, s.model_id, s.model_parallel_size, s.max_batch_size, s.max_seq_len, s.quantization) == (
        other,
        "Llama3.1-8B-Instruct",
        4,
        5,
        256,
        "fp8_mixed",
    )
    assert s.sources["max_seq_len"].describe() == "environment variable MAX_SEQ_LEN"
    # an entry describes its own folder: with the folder from INFERENCE_CHECKPOINT_DIR it is not used
    # ... and with no dtype asked for, a quantization mode (fp8_mixed from QUANTIZATION_TYPE) stores the
    # unquantized parts in bfloat16, as Llama Stack does
    assert s.dtype == torch.bfloat16 and s.sources["dtype"].kind == "default"
    monkeypatch.delenv("INFERENCE_CHECKPOINT_DIR")
    s = resolve_settings()  # the default entry is selected; the other variables still override its values
    assert (s.checkpoint_dir, s.max_seq_len, s.dtype) == (llama3_dir.resolve(), 256, torch.bfloat16)
    assert "[tiny]" in s.sources["dtype"].describe()

    for var in env:
        monkeypatch.delenv(var, raising=False)
    s = resolve_settings()  # the file's default entry
    assert (s.checkpoint_dir, s.model_id, s.model_parallel_size, s.max_batch_size, s.max_seq_len, s.quantization) == (
        llama3_dir.resolve(),
        "Llama3.2-3B-Instruct",
        2,
        3,
        128,
        "int4_mixed",
    )
    assert s.sources["max_seq_len"].describe() == f"checkpoints.toml entry [tiny] in {clean_env / 'checkpoints.toml'}"

    (clean_env / "checkpoints.toml").unlink()
    s = resolve_settings()  # embedded default
    assert s.checkpoint_dir == default_checkpoint_dir().resolve() and s.max_seq_len == 2048


def test_env_overrides_a_named_entry_and_arguments_override_env(monkeypatch, clean_env, llama3_dir):
    write_toml(clean_env / "checkpoints.toml", f'[scout]\npath = "{llama3_dir}"\nmax_seq_len = 100\n')
    assert resolve_settings("scout").max_seq_len == 100
    monkeypatch.setenv("MAX_SEQ_LEN", "200")
    assert resolve_settings("scout").max_seq_len == 200
    assert resolve_settings("scout", max_seq_len=300).max_seq_len == 300
    # Llama Stack's unset spellings count as unset
    monkeypatch.setenv("MAX_SEQ_LEN", "null")
    monkeypatch.setenv("INFERENCE_CHECKPOINT_DIR", "null")
    assert resolve_settings("scout").max_seq_len == 100
    assert resolve_settings().checkpoint_dir == default_checkpoint_dir().resolve()


def test_quantization_none_string_overrides_env(monkeypatch):
    monkeypatch.setenv("QUANTIZATION_TYPE", "fp8_mixed")
    assert resolve_settings().quantization == "fp8_mixed"
    assert resolve_settings(quantization="none").quantization is None


def test_entry_path_is_relative_to_its_file_and_files_merge_in_order(monkeypatch, clean_env, tmp_path):
    conf = tmp_path / "conf"
    write_toml(conf / "checkpoints.toml", '[a]\npath = "models/a"\nmax_seq_len = 1\n')
    write_toml(clean_env / "checkpoints.toml", '[a]\npath = "/x/a"\nmax_seq_len = 2\n[b]\npath = "/x/b"\n')
    user = write_toml(
        tmp_path / "config-home" / "workbench" / "checkpoints.toml", '[b]\npath = "/y/b"\n[c]\npath = "~/c"\n'
    )
    monkeypatch.setenv("WORKBENCH_CHECKPOINTS", str(conf))  # a folder holding checkpoints.toml
    assert resolve_settings("a").checkpoint_dir == (conf / "models" / "a").resolve()
    assert resolve_settings("b").checkpoint_dir == Path("/x/b")  # working folder before user config
    assert resolve_settings("c").checkpoint_dir == (Path.home() / "c").resolve()
    assert [f.path for f in Catalog.discover().files] == [
        conf / "checkpoints.toml",
        clean_env / "checkpoints.toml",
        user,
    ]


def test_path_arguments_are_never_entry_names(clean_env, llama3_dir):
    write_toml(clean_env / "checkpoints.toml", f'[sub]\npath = "{llama3_dir}"\n')
    (clean_env / "sub").mkdir()
    assert resolve_settings("./sub").checkpoint_dir == (clean_env / "sub").resolve()
    assert resolve_settings("sub").checkpoint_dir == llama3_dir.resolve()  # the entry wins over the bare name
    assert resolve_settings(Path("sub")).checkpoint_dir == (clean_env / "sub").resolve()


def test_example_file_is_in_sync_with_the_parser():
    example = REPO / "checkpoints.example.toml"
    parsed = ConfigFile.read(example)
    assert parsed.entries
    for name, entry in parsed.entries.items():
        check_entry(name, entry, example)
    keys_section = example.read_text().split("# Keys of an entry")[1]
    documented = set(re.findall(r"^#   ([a-z_]+)\s", keys_section, flags=re.MULTILINE))
    assert documented == set(ENTRY_KEYS)
    for var in ENV_VARS.values():
        assert var in example.read_text()


# --------------------------------------------------------------------------------------------- bad settings
@pytest.mark.parametrize(
    "body,needles",
    [
        ('[m]\npath = "/p"\nmax_seq = 4\n', ["unknown key 'max_seq'", "did you mean `max_seq_len`", "[m] in"]),
        ('[m]\npath = "/p"\nmax_seq_len = "4096"\n', ["max_seq_len = '4096'", "TOML integer", "[m] in"]),
        ('[m]\npath = "/p"\nmodel_parallel_size = true\n', ["model_parallel_size = True", "integer"]),
        ("[m]\npath = 3\n", ["path = 3", "TOML string"]),
        ('[m]\nmodel = "x"\n', ["has no `path`"]),
        ('[m.v1]\npath = "/p"\n', ["unknown key 'v1'", 'quote the entry name, ["m.v1"]']),
        ('[m]\npath = "/p"\nmax_seq_len = \n', ["not valid TOML", "fix the syntax"]),
        ('path = "/p"\n[m]\npath = "/p"\n', ["top-level key 'path'", "[name] header"]),
        ('default = "n"\n[m]\npath = "/p"\n', ["default = 'n' names no entry", "['m']"]),
    ],
)
def test_bad_checkpoints_toml_names_file_entry_and_fix(clean_env, body, needles):
    toml = write_toml(clean_env / "checkpoints.toml", body)
    with pytest.raises(ConfigError) as info:
        resolve_settings("m")
    message = str(info.value)
    assert str(toml) in message
    for needle in needles:
        assert needle in message


def test_unknown_entry_name_suggests_and_lists(clean_env):
    write_toml(clean_env / "checkpoints.toml", '[scout]\npath = "/p"\n[llama3-8b]\npath = "/q"\n')
    with pytest.raises(ConfigError) as info:
        resolve_settings("scoot")
    message = str(info.value)
    assert "did you mean 'scout'" in message and "llama3-8b" in message and "checkpoints.toml" in message


def test_missing_workbench_checkpoints_file(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CHECKPOINTS", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="WORKBENCH_CHECKPOINTS.*names no checkpoints.toml.*unset the variable"):
        resolve_settings("x")


@pytest.mark.parametrize(
    "var,value,needle",
    [
        ("MAX_SEQ_LEN", "8k", "max_seq_len='8k' (from environment variable MAX_SEQ_LEN) must be a positive integer"),
        ("MAX_BATCH_SIZE", "0", "max_batch_size=0 (from environment variable MAX_BATCH_SIZE)"),
        ("MODEL_PARALLEL_SIZE", "-1", "model_parallel_size='-1' (from environment variable MODEL_PARALLEL_SIZE)"),
        ("QUANTIZATION_TYPE", "int3", "quantization='int3' (from environment variable QUANTIZATION_TYPE)"),
    ],
)
def test_bad_environment_values(monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        resolve_settings()
    assert needle in str(info.value) and f"fix or unset the environment variable {var}" in str(info.value)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(max_batch_size=0), "max_batch_size=0 (from argument)"),
        (dict(max_seq_len=2.5), "max_seq_len=2.5 (from argument)"),
        (dict(model_parallel_size=True), "model_parallel_size=True (from argument)"),
        (dict(dtype="float8"), "dtype='float8' (from argument) is not one of"),
        (dict(device="tpu"), "device='tpu' (from argument) is not supported"),
        (dict(quantization="int2"), "quantization='int2' (from argument) is not a quantization mode"),
        (dict(model=""), "model='' (from argument)"),
    ],
)
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        resolve_settings(**kwargs)
    assert needle in str(info.value) and "workbench.load()" in str(info.value)


def test_cuda_without_gpu_is_a_config_error():
    if torch.cuda.is_available():
        assert resolve_settings(device="cuda").device == "cuda"
    else:
        with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
            resolve_settings(device="cuda")


# --------------------------------------------------------------------------------------------- checkpoint checks
def test_missing_folder_names_its_source(clean_env, tmp_path):
    with pytest.raises(MissingCheckpointFileError, match="does not exist.*pass a valid checkpoint="):
        check_settings(resolve_settings(tmp_path / "nope"))
    toml = write_toml(clean_env / "checkpoints.toml", f'[gone]\npath = "{tmp_path / "gone"}"\n')
    with pytest.raises(MissingCheckpointFileError) as info:
        check_settings(resolve_settings("gone"))
    assert f"[gone] in {toml}" in str(info.value) and "edit `path = ...`" in str(info.value)


def test_folder_without_params_or_shards(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingCheckpointFileError, match="params.json"):
        check_settings(resolve_settings(empty))
    no_shards = fake_checkpoint(tmp_path / "no-shards", TINY_LLAMA3, n_shards=0)
    with pytest.raises(MissingCheckpointFileError, match="no consolidated.NN.pth shards"):
        check_settings(resolve_settings(no_shards))


def test_shard_count_must_fit_model_parallel_size(monkeypatch, tmp_path):
    two = fake_checkpoint(tmp_path / "two", TINY_LLAMA3, n_shards=2)
    monkeypatch.setenv("MODEL_PARALLEL_SIZE", "3")
    with pytest.raises(ConfigError) as info:
        check_settings(resolve_settings(two))
    message = str(info.value)
    assert "model_parallel_size=3 (from environment variable MODEL_PARALLEL_SIZE) does not fit" in message
    assert "2 shards" in message and "MODEL_PARALLEL_SIZE" in message.split(";")[-1]
    for size in (1, 2, 4):
        assert check_settings(resolve_settings(two, model_parallel_size=size)).model_parallel_size == size
    monkeypatch.setenv("MODEL_PARALLEL_SIZE", "0")  # Llama Stack's "auto": one rank per shard
    assert check_settings(resolve_settings(two)).model_parallel_size == 2


@pytest.mark.parametrize(
    "params,size,needle",
    [
        (TINY_LLAMA3, 8, "n_heads=4 is not divisible"),
        ({**TINY_LLAMA3, "n_heads": 12, "n_kv_heads": 4, "dim": 192}, 6, "n_kv_heads=4 neither divides"),
        ({**TINY_LLAMA3, "vocab_size": 128257}, 2, "vocab_size=128257"),
        ({**TINY_LLAMA3, "multiple_of": 1, "ffn_dim_multiplier": None}, 2, "dense feed-forward size 341"),
    ],
)
def test_model_shapes_must_fit_model_parallel_size(tmp_path, params, size, needle):
    folder = fake_checkpoint(tmp_path / "ckpt", params)
    with pytest.raises(ConfigError) as info:
        check_settings(resolve_settings(folder, model_parallel_size=size))
    assert needle in str(info.value) and f"model_parallel_size={size} (from argument)" in str(info.value)


def test_more_ranks_than_kv_heads_is_allowed(tmp_path):
    folder = fake_checkpoint(tmp_path / "kv1", {**TINY_LLAMA3, "n_kv_heads": 1})
    assert check_settings(resolve_settings(folder, model_parallel_size=4)).model_parallel_size == 4
