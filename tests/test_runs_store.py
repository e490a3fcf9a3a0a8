"""The run store on its own (workbench.runs): exact keys, checkpoint identity, SQLite under concurrent writers,
kills and faults, exact result round trips, browsing, exports and the Inspect log.  The engine's use of it
(``run=`` on every method) is tested with the engine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from workbench import batches as wb_batches
from workbench import runs
from workbench.demo.artifact import ARTIFACT, DEFAULT_MODEL_VERSION
from workbench.errors import InputError, StoreError, StoreWarning
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.reports import short_path
from workbench.runs import identity as identity_module
from workbench.runs.store import Store
from workbench.types import ChatCompletion, Completion, Message, ScoredRow, TokenLogprob, ToolCall, Transcript

CHILD = Path(__file__).with_name("_runs_child.py")
LOAD = runs.load_fields({"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop": [], "logprobs": 0, "seed": None}


def provenance(quantization: str | None = None, identity: str = "sha256:test-checkpoint") -> runs.Provenance:
    return runs.Provenance(
        identity=identity,
        load={**LOAD, "quantization": quantization},
        model="tiny",
        checkpoint="/ckpt/tiny",
        device="cpu",
    )


def child(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def completion(text: str, tokens: list[int], **kw) -> Completion:
    return Completion(text=text, tokens=tokens, stop_reason="end_of_turn", **kw)


# ---------------------------------------------------------------------------------------------- keys
def test_keys_miss_on_everything_that_changes_numbers_and_hit_on_spelling():
    ids = [128000, 9906, 1917]
    base = runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, GREEDY))
    same = [
        runs.row_key("sha256:a", dict(reversed(list(LOAD.items()))), runs.RowRequest(list(ids), dict(GREEDY))),
        runs.row_key("sha256:a", LOAD, runs.RowRequest(tuple(ids), {**GREEDY, "temperature": 0})),  # 0 == 0.0
        runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, {k: v for k, v in GREEDY.items() if k != "seed"})),
    ]
    assert {k.key for k in same} == {base.key}
    cuda0 = runs.load_fields({"dtype": "bfloat16", "model_parallel_size": 1, "device": "cuda:0"})
    cuda1 = runs.load_fields({"dtype": "bfloat16", "model_parallel_size": 1, "device": "cuda:1"})
    assert cuda0 == cuda1  # the device *type* changes numbers, not the GPU's index
    misses = {
        "checkpoint": runs.row_key("sha256:b", LOAD, runs.RowRequest(ids, GREEDY)),
        "quantization": runs.row_key("sha256:a", {**LOAD, "quantization": "int4_mixed"}, runs.RowRequest(ids, GREEDY)),
        "dtype": runs.row_key("sha256:a", {**LOAD, "dtype": "float32"}, runs.RowRequest(ids, GREEDY)),
        "model_parallel_size": runs.row_key(
            "sha256:a", {**LOAD, "model_parallel_size": 2}, runs.RowRequest(ids, GREEDY)
        ),
        "device": runs.row_key("sha256:a", {**LOAD, "device_type": "cuda"}, runs.RowRequest(ids, GREEDY)),
        "prompt": runs.row_key("sha256:a", LOAD, runs.RowRequest([*ids, 13], GREEDY)),
        "kind": runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, GREEDY, kind="chat")),
        "image": runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, GREEDY, images=[b"png bytes"])),
        "extra": runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, GREEDY, extra={"tool_prompt_format": "json"})),
    }
    for name, value in [
        ("temperature", 0.5),
        ("top_p", 0.9),
        ("top_k", 5),
        ("max_tokens", 17),
        ("stop", ["\n"]),
        ("logprobs", 3),
        ("seed", 1234),
        ("constrain_tools", True),
        ("response_format", {"type": "json_schema", "json_schema": {"type": "object"}}),
    ]:
        misses[name] = runs.row_key("sha256:a", LOAD, runs.RowRequest(ids, {**GREEDY, name: value}))
    keys = [k.key for k in misses.values()]
    assert base.key not in keys and len(set(keys)) == len(keys), "every change must give its own key"
    # the request identity ignores the engine: bf16 and int4_mixed rows pair up for compare()
    assert misses["quantization"].match == misses["checkpoint"].match == base.match
    assert misses["seed"].match != base.match


def test_keys_miss_for_another_numerics_version(monkeypatch):
    match = runs.request_identity([1, 2], GREEDY)
    before = runs.cache_key("sha256:a", LOAD, match)
    monkeypatch.setattr("workbench.runs.keys.NUMERICS_VERSION", runs.NUMERICS_VERSION + 1)
    assert runs.cache_key("sha256:a", LOAD, match) != before


def test_keys_of_tool_and_format_prompts_are_the_rendered_ids():
    formatter = make_formatter(Tokenizer(bundled_tokenizer_path("llama3")), "Llama3.1-8B-Instruct")
    dialog = [{"role": "user", "content": "What is the weather in Paris?"}]
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    time_tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    prompts = [
        formatter.encode_dialog(dialog),
        formatter.encode_dialog(dialog, tools=[weather]),
        formatter.encode_dialog(dialog, tools=[time_tool]),
        formatter.encode_dialog(dialog, tools=[weather], tool_prompt_format="function_tag"),
    ]
    keys = [runs.row_key("sha256:a", LOAD, runs.RowRequest(p, GREEDY, kind="chat")).key for p in prompts]
    assert len(set(keys)) == len(keys)
    again = runs.row_key(
        "sha256:a", LOAD, runs.RowRequest(formatter.encode_dialog(dialog, tools=[weather]), GREEDY, kind="chat")
    )
    assert again.key == keys[1]


def test_unseeded_sampled_rows_get_a_drawn_seed_and_numbered_repeats():
    sampled = {**GREEDY, "temperature": 0.8}
    settled, drawn = runs.settle_seed(sampled)
    assert drawn and isinstance(settled["seed"], int) and 0 <= settled["seed"] < 2**63
    assert sampled["seed"] is None  # the request as given is untouched
    assert runs.settle_seed({**sampled, "seed": 7}) == ({**sampled, "seed": 7}, False)
    assert runs.settle_seed(GREEDY) == (GREEDY, False)
    assert len({runs.draw_seed() for _ in range(8)}) == 8
    requests = [runs.RowRequest([1, 2], sampled)] * 3 + [runs.RowRequest([1, 2], GREEDY)] * 2
    keys = runs.request_keys("sha256:a", LOAD, requests)
    assert len({k.key for k in keys[:3]}) == 3, "repeats of an unseeded sampled request are distinct samples"
    assert keys[3] == keys[4], "repeats of a greedy request are one answer"
    assert [k.key for k in runs.request_keys("sha256:a", LOAD, requests)] == [k.key for k in keys]


def test_image_digests_are_by_content():
    red = Image.new("RGB", (8, 8), (255, 0, 0))
    assert runs.image_digest(red) == runs.image_digest(red.copy())
    assert runs.image_digest(red) != runs.image_digest(Image.new("RGB", (8, 8), (254, 0, 0)))
    assert runs.image_digest(b"abc") != runs.image_digest(b"abd")
    with pytest.raises(InputError, match="cannot hash an image"):
        runs.image_digest(3.5)


# ---------------------------------------------------------------------------------------------- identity
@pytest.fixture
def own_checkpoint(llama3_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny checkpoint that the test may edit in place."""
    return Path(shutil.copytree(llama3_dir, tmp_path / "ckpt"))


def test_checkpoint_identity_is_hashed_once_and_follows_edits_in_place(own_checkpoint, tmp_path, monkeypatch):
    hashed: list[str] = []
    real = identity_module.file_sha256
    monkeypatch.setattr(identity_module, "file_sha256", lambda p, cb=None: hashed.append(Path(p).name) or real(p, cb))
    store_file = tmp_path / "runs.sqlite"
    first = Store(store_file).checkpoint_identity(own_checkpoint)
    assert first.digest.startswith("sha256:") and sorted(hashed) == sorted(first.files)
    assert {"params.json", "tokenizer.model", "consolidated.00.pth"} <= set(first.files)
    hashed.clear()
    assert Store(store_file).checkpoint_identity(own_checkpoint) == first  # another Store: the file's memo
    assert hashed == []
    copy = Path(shutil.copytree(own_checkpoint, tmp_path / "copy"))
    assert Store(store_file).checkpoint_identity(copy).digest == first.digest  # the content, not the path

    shard = own_checkpoint / "consolidated.00.pth"
    with open(shard, "ab") as f:  # size changes
        f.write(b"\0")
    hashed.clear()
    grown = Store(store_file).checkpoint_identity(own_checkpoint)
    assert hashed == ["consolidated.00.pth"] and grown.digest != first.digest

    data = bytearray(shard.read_bytes())  # same size, one byte edited, mtime moves
    data[len(data) // 2] ^= 0xFF
    stamp = shard.stat().st_mtime_ns
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stamp + 10**9, stamp + 10**9))
    hashed.clear()
    edited = Store(store_file).checkpoint_identity(own_checkpoint)
    assert hashed == ["consolidated.00.pth"] and edited.digest not in (first.digest, grown.digest)


def test_the_demo_model_is_identified_by_its_artifact(tmp_path, monkeypatch):
    hashed: list[str] = []
    real = identity_module.file_sha256
    monkeypatch.setattr(identity_module, "file_sha256", lambda p, cb=None: hashed.append(Path(p).name) or real(p, cb))
    prefix = real(ARTIFACT)[:12]
    folder = tmp_path / f"{DEFAULT_MODEL_VERSION}-{prefix}"
    folder.mkdir()
    (folder / "consolidated.00.pth").write_bytes(b"never read")
    found = Store(tmp_path / "runs.sqlite").checkpoint_identity(folder)
    assert found.digest.startswith("demo:") and found.files == {ARTIFACT.name: real(ARTIFACT)}
    assert hashed == [ARTIFACT.name]
    with pytest.raises(InputError, match="params.json"):
        runs.checkpoint_identity(tmp_path)


# ---------------------------------------------------------------------------------------------- codec
def test_results_round_trip_exactly():
    logprobs = [
        TokenLogprob(5, "Hi", -0.25, {"Hi": -0.25, "Yo": float("-inf")}, [5, 9]),
        TokenLogprob(6, "!", -1e-9, {}, []),
    ]
    image = Image.new("RGB", (3, 2), (1, 2, 3))
    values = [
        Completion("Hi!", [5, 6], "out_of_tokens", logprobs, 7, {"a": (1, 2), "b": [1.5, None], 3: "int key"}, None),
        Completion("{", [1], "end_of_turn", None, 3, None, "unterminated object", cached=True),
        ChatCompletion(
            Message(
                "assistant",
                "",
                [ToolCall("get_weather", {"city": "Paris", "n": 2.0}, "c1")],
                stop_reason="end_of_message",
            ),
            [1, 2, 3],
            "end_of_message",
            None,
            12,
        ),
        ChatCompletion(Message("assistant", "bad call", parse_error="cut by max_tokens"), [4], "out_of_tokens"),
        Transcript(
            [
                Message("user", ["What is this?", image, {"type": "image", "image": b"\x89PNG"}]),
                {"role": "user", "content": "plain dict", "__wb": "not a tag"},
                Message("assistant", "", [ToolCall("f", {"x": [1, {"y": 2}]}, "c")]),
                Message("tool", "42", call_id="c"),
            ],
            stop_reason="answered",
            generated_tokens=17,
        ),
        ScoredRow([-0.5, float("-inf")], [True, False]),
        [Completion("a", [1], "end_of_turn"), Completion("b", [2], "end_of_turn")],
    ]
    for value in values:
        text = runs.dumps(value)
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not strict JSON"))
        back = runs.loads(text)
        assert type(back) is type(value) and back == value
        if isinstance(value, (Completion, ChatCompletion)):
            assert back.cached == value.cached and back.logprobs == value.logprobs
        if isinstance(value, Transcript):
            assert (back.stop_reason, back.generated_tokens) == (value.stop_reason, value.generated_tokens)
            assert back[0].content[1].tobytes() == image.tobytes() and back[0].content[2]["image"] == b"\x89PNG"
    assert isinstance(runs.loads(runs.dumps(values[0])).parsed["a"], tuple)
    with pytest.raises(InputError, match="cannot store"):
        runs.dumps(object())


def test_pydantic_parsed_objects_come_back_given_their_class():
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        people: int

    result = completion('{"name": "Paris", "people": 2}', [1], parsed=City(name="Paris", people=2))
    assert runs.loads(runs.dumps(result), parsed_type=City) == result
    assert runs.loads(runs.dumps(result)).parsed == {"name": "Paris", "people": 2}


def test_cached_is_not_part_of_equality_or_repr():
    assert completion("a", [1], cached=True) == completion("a", [1])
    assert "cached" not in repr(completion("a", [1], cached=True))


# ---------------------------------------------------------------------------------------------- store
@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    return tmp_path / "store" / "runs.sqlite"


def test_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "mine.sqlite"))
    assert runs.path() == tmp_path / "mine.sqlite"
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path))  # a folder: the default name inside
    assert runs.path() == tmp_path / "runs.sqlite"
    monkeypatch.delenv("WORKBENCH_STORE")  # the default: workbench's data folder (shared with the Batch API)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / "data"))
    assert runs.path() == tmp_path / "data" / "runs.sqlite" == wb_batches.default_data_dir() / "runs.sqlite"
    monkeypatch.delenv("WORKBENCH_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert runs.path() == tmp_path / "xdg" / "workbench" / "runs.sqlite"
    assert (
        short_path(Path.home() / ".local" / "share" / "workbench" / "runs.sqlite")
        == "~/.local/share/workbench/runs.sqlite"
    )
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / "data"))
    assert short_path(runs.path()) == "$WORKBENCH_DATA_DIR/runs.sqlite"  # how notebooks show it


def test_rows_are_stored_at_once_and_answered_exactly(store_file):
    st = runs.store(store_file)
    run = st.open_run("sweep", provenance())
    assert st.open_run("sweep", provenance()) is run  # one session per process and provenance
    keys = run.keys([runs.RowRequest([1, i], GREEDY) for i in range(5)])
    assert run.lookup(keys) == {}
    outputs = [completion(f"row {i}", [i, i + 1], prompt_tokens=2) for i in range(5)]
    for i in (0, 2, 4):
        assert run.put(
            keys[i],
            request={"prompt": f"p{i}"},
            prompt_ids=[1, i],
            output=outputs[i],
            sampling=GREEDY,
            timings={"seconds": 0.5},
        )
        other = sqlite3.connect(store_file)  # committed: another connection sees it at once
        assert other.execute("SELECT count(*) FROM rows").fetchone()[0] == i // 2 + 1
        other.close()
    found = run.lookup(keys)
    assert set(found) == {keys[i].key for i in (0, 2, 4)}
    for i in (0, 2, 4):
        row = found[keys[i].key]
        assert row.output == outputs[i] and row.output.cached and row.computed
        assert row.prompt_ids == [1, i] and row.request == {"prompt": f"p{i}"} and row.timings == {"seconds": 0.5}
    # refresh: recomputed and replaced in place
    assert run.put(keys[0], request={"prompt": "p0"}, prompt_ids=[1, 0], output=completion("new", [9]))
    assert run.lookup([keys[0]])[keys[0].key].output == completion("new", [9])
    assert st.integrity_check() == "ok" and len(list(st.rows("sweep"))) == 3


def test_another_run_answers_an_identical_key_and_the_run_keeps_it(store_file):
    st = runs.store(store_file)
    first, second = st.open_run("first", provenance()), st.open_run("second", provenance())
    key = first.key([3, 4], GREEDY)
    first.put(key, request={"prompt": "x"}, prompt_ids=[3, 4], output=completion("x", [1]))
    assert second.lookup([key], anywhere=False) == {}
    row = second.lookup([key])[key.key]
    assert row.output == completion("x", [1]) and row.run == "first"
    kept = list(st.rows("second"))
    assert len(kept) == 1 and not kept[0].computed and kept[0].output == completion("x", [1])
    quantized = st.open_run("second", provenance("int4_mixed"))
    assert quantized.lookup([quantized.key([3, 4], GREEDY)]) == {}  # another engine: no hit


def test_two_writer_processes_and_identical_keys_from_another_process(store_file):
    """Both children create the store (racing) and write one run at once."""
    writers = [child("writer", str(store_file), str(tag), "120") for tag in (1, 2)]
    outputs = [w.communicate(timeout=240) for w in writers]
    for w, (_, err) in zip(writers, outputs):
        assert w.returncode == 0, err
    keys = [json.loads(out.splitlines()[-1]) for out, _ in outputs]
    st = runs.store(store_file)
    assert st.integrity_check() == "ok"
    stored = list(st.rows("shared"))
    assert len(stored) == 120 * 2 + 10 and len({r.key for r in stored}) == len(stored)
    run = st.open_run(
        "shared",
        runs.Provenance(
            identity="sha256:test-checkpoint",
            load=runs.load_fields(
                {"dtype": "bfloat16", "quantization": None, "model_parallel_size": 1, "device": "cpu"}
            ),
            model="tiny",
        ),
    )
    mine = run.keys([runs.RowRequest([7, 7, i], {"temperature": 0.0, "max_tokens": 8}) for i in range(10)])
    assert [k.key for k in mine] == keys[0]["shared"] == keys[1]["shared"]
    assert not keys[0]["pandas_imported"], "storing rows must not import pandas (import workbench stays light)"
    found = run.lookup(mine)
    assert len(found) == 10
    assert all(found[k.key].output.text == f"answer {[7, 7, i]}" for i, k in enumerate(mine))


def test_a_killed_writer_leaves_an_intact_file_with_every_committed_group(store_file):
    runs.store(store_file)
    group = 20
    proc = child("endless", str(store_file), str(group))
    committed = 0
    deadline = time.monotonic() + 120
    while committed < 200 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        committed = int(line)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert committed >= 200, proc.stderr.read()
    st = Store(store_file)
    assert st.integrity_check() == "ok"
    stored = list(st.rows("killed"))
    assert len(stored) >= committed and len(stored) % group == 0, "a group is committed whole or not at all"
    assert {tuple(r.prompt_ids) for r in stored} >= {(5, i) for i in range(committed)}
    assert all(r.output.text.startswith(f"answer {r.prompt_ids}") for r in stored)


def test_a_full_disk_warns_once_and_never_raises(store_file):
    runs.store(store_file)
    proc = child("full", str(store_file))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert True in report["results"] and False in report["results"]
    assert len(report["warnings"]) == 1 and str(store_file) in report["warnings"][0]
    assert report["stored_after"], "the store works again once there is room"
    st = Store(store_file)
    assert st.integrity_check() == "ok"
    assert len(list(st.rows("full"))) == 1 + report["results"].count(True) + 1


def test_a_read_only_store_answers_what_it_holds_warns_once_and_never_raises():
    folder = Path(tempfile.mkdtemp(prefix="wb-readonly-"))
    try:
        os.chmod(folder, 0o777)  # others may create the WAL index beside it; the store file itself is read-only
        path = folder / "runs.sqlite"
        writer = Store(path)
        run = writer.open_run("r", provenance())
        key = run.key([1, 2], GREEDY)
        run.put(key, request={"prompt": "a"}, prompt_ids=[1, 2], output=completion("a", [1]))
        writer.close()
        os.chmod(path, 0o444)
        as_nobody = os.geteuid() == 0  # root writes read-only files: read it as another user
        if as_nobody:
            os.seteuid(65534)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                reader = Store(path).check()
                again = reader.open_run("r", provenance())
                found = again.lookup([key])
                puts = [
                    again.put(again.key([3], GREEDY), request={}, prompt_ids=[3], output=completion("b", [2]))
                    for _ in range(3)
                ]
                reader.close()
        finally:
            if as_nobody:
                os.seteuid(0)
        assert found[key.key].output == completion("a", [1])
        assert puts == [False, False, False]
        store_warnings = [w for w in caught if issubclass(w.category, StoreWarning)]
        assert len(store_warnings) == 1 and "readonly" in str(store_warnings[0].message)
        assert str(path) in str(store_warnings[0].message)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_readonly_mode_never_writes(store_file):
    Store(store_file).open_run("r", provenance()).put(
        runs.row_key("sha256:test-checkpoint", provenance().load, runs.RowRequest([1], GREEDY)),
        request={},
        prompt_ids=[1],
        output=completion("a", [1]),
    )
    reader = Store(store_file, readonly=True)
    with pytest.warns(StoreWarning, match="could not be written"):
        run = reader.open_run("r", provenance())
    assert run.lookup([run.key([1], GREEDY)])
    assert run.put(run.key([2], GREEDY), request={}, prompt_ids=[2], output=completion("b", [2])) is False


def test_files_that_are_no_store_or_a_newer_one_get_a_clear_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database\n" * 10)
    with pytest.raises(StoreError, match="not an SQLite database") as info:
        runs.store(text)
    assert str(text) in str(info.value) and "WORKBENCH_STORE" in str(info.value)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE things (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="another program"):
        runs.store(other)
    newer = tmp_path / "newer.sqlite"
    Store(newer).check().close()
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer workbench") as info:
        Store(newer).open_run("r", provenance())
    assert str(newer) in str(info.value) and "upgrade workbench" in str(info.value)
    with pytest.raises(StoreError, match="is a folder"):
        Store(tmp_path).check()


def test_bad_names_and_unknown_runs(store_file):
    st = runs.store(store_file)
    for bad in ("", "   ", 3, "x" * 201, "tab\there"):
        with pytest.raises(InputError, match="run name"):
            st.open_run(bad, provenance())
    with pytest.raises(InputError, match="no run named 'nope'"):
        runs.rows("nope", store=st)
    with pytest.raises(InputError, match="checkpoint identity"):
        runs.Provenance(identity="", load=LOAD)


def test_provenance_records_engine_and_environment(store_file):
    st = runs.store(store_file)
    st.open_run("traced", provenance("fp8_mixed")).put(
        runs.row_key("sha256:test-checkpoint", {**LOAD, "quantization": "fp8_mixed"}, runs.RowRequest([1], GREEDY)),
        request={"prompt": "x", "tools": [len]},
        prompt_ids=[1],
        output=completion("y", [2]),
    )
    (prov,) = st.sessions("traced").values()
    assert prov["checkpoint_identity"] == "sha256:test-checkpoint" and prov["load"]["quantization"] == "fp8_mixed"
    assert prov["checkpoint_path"] == "/ckpt/tiny" and prov["model"] == "tiny" and prov["device"] == "cpu"
    assert prov["torch_version"] and prov["workbench_version"] and prov["host"] and prov["pid"] == os.getpid()
    assert prov["numerics_version"] == runs.NUMERICS_VERSION and prov["session_started_at"] > 0
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    assert prov["git_commit"] == (git.stdout.strip() or None)
    (row,) = st.rows("traced")
    assert row.request == {"prompt": "x", "tools": [{"callable": "builtins.len"}]}


# ---------------------------------------------------------------------------------------------- browsing
@pytest.fixture
def two_runs(store_file: Path) -> Store:
    """bf16 and int4_mixed runs of the same five requests: rows 1 and 3 differ, row 4 only in bf16."""
    st = runs.store(store_file)
    for name, quantization in (("bf16", None), ("int4", "int4_mixed")):
        run = st.open_run(name, provenance(quantization))
        for i in range(5 if name == "bf16" else 4):
            sampling = {**GREEDY, "temperature": 0.7, "seed": 2**64 - 1 - i} if i == 2 else GREEDY
            key = run.key([10, i], sampling, kind="chat")
            differs = name == "int4" and i in (1, 3)
            calls = [ToolCall("get_weather", {"city": "Paris" if not differs else "Lyon"}, f"c{i}")] if i == 1 else []
            message = Message("assistant", f"reply {i}{'!' if differs else ''}", calls)
            out = ChatCompletion(message, [i, 7 if differs else 8], "end_of_turn", prompt_tokens=2)
            run.put(
                key,
                request={"messages": [{"role": "user", "content": f"question {i}"}]},
                prompt_ids=[10, i],
                output=out,
                sampling=sampling,
                timings={"seconds": 0.25},
            )
    tool_run = st.open_run("tools", provenance())
    transcript = Transcript(
        [
            Message("user", "weather?"),
            Message("assistant", "", [ToolCall("w", {"c": "P"}, "1")]),
            Message("tool", "sunny", call_id="1"),
            Message("assistant", "It is sunny."),
        ],
        stop_reason="answered",
        generated_tokens=9,
    )
    tool_run.put(
        tool_run.key([1, 2, 3], GREEDY, kind="transcript"),
        request={"messages": [{"role": "user", "content": "weather?"}]},
        prompt_ids=[1, 2, 3],
        output=transcript,
    )
    return st


def test_table_rows_and_delete(two_runs):
    table = runs.table(store=two_runs)
    assert list(table.columns)[0] == "run" and list(table["run"]) == ["bf16", "int4", "tools"]
    assert list(table["rows"]) == [5, 4, 1]
    assert [q if isinstance(q, str) else None for q in table["quantization"]] == [None, "int4_mixed", None]
    frame = runs.rows("int4", store=two_runs)
    assert len(frame) == 4 and frame.loc[1, "tool_calls"] == 'get_weather({"city": "Lyon"})'
    assert frame.loc[1, "n_tool_calls"] == 1 and frame.loc[0, "prompt"] == "question 0"
    assert frame.loc[2, "seed"] == 2**64 - 3 and isinstance(frame.loc[2, "seed"], int)  # 64-bit seed, unrounded
    for column in ("checkpoint_identity", "quantization", "workbench_version", "seed", "computed"):
        assert column in frame.columns
    assert set(frame["quantization"]) == {"int4_mixed"} and set(frame["checkpoint_identity"]) == {
        "sha256:test-checkpoint"
    }
    tools = runs.rows("tools", store=two_runs)
    assert tools.loc[0, "output"] == "It is sunny." and tools.loc[0, "tool_calls"] == 'w({"c": "P"})'
    assert "bf16" in two_runs._repr_html_()
    (row,) = list(two_runs.rows("tools"))
    assert "sunny" in row._repr_html_()
    assert runs.delete("bf16", store=two_runs) == 5
    assert list(runs.table(store=two_runs)["run"]) == ["int4", "tools"]
    with pytest.raises(InputError, match="no run named 'bf16'"):
        runs.rows("bf16", store=two_runs)


def test_compare_pairs_requests_across_engines(two_runs):
    diff = runs.compare("bf16", "int4", store=two_runs, by="request")  # exact requests (identical prompt ids)
    assert diff.attrs["both"] == 4 and diff.attrs["differ"] == 2 and diff.attrs["only_a"] == 1
    assert list(diff["prompt"]) == ["question 1", "question 3"]
    assert list(diff["first_differing_token"]) == [1, 1]
    assert diff.loc[0, "a_tool_calls"] != diff.loc[0, "b_tool_calls"]
    assert list(diff["b_quantization"]) == ["int4_mixed"] * 2
    everything = runs.compare("bf16", "int4", store=two_runs, by="request", differing_only=False)
    assert len(everything) == 4 and everything["same"].sum() == 2


def test_exports_read_back(two_runs, tmp_path):
    parquet = runs.export("bf16", tmp_path / "out" / "bf16.parquet", store=two_runs)
    frame = pd.read_parquet(parquet)
    assert len(frame) == 5 and list(frame["prompt"])[:2] == ["question 0", "question 1"]
    assert list(frame["prompt_ids"].iloc[1]) == [10, 1]
    assert runs.loads(frame.loc[1, "result"]).message.tool_calls[0].arguments == {"city": "Paris"}
    lines = runs.export("bf16", tmp_path / "bf16.jsonl", store=two_runs).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    stored = list(two_runs.rows("bf16"))
    assert [r["key"] for r in records] == [r.key for r in stored]
    assert [runs.decode(r["result"]) for r in records] == [r.output for r in stored]
    assert records[2]["seed"] == 2**64 - 3 and records[2]["provenance"]["load"]["quantization"] is None
    with pytest.raises(InputError, match="export format"):
        runs.export("bf16", tmp_path / "bf16.csv", store=two_runs)


def test_inspect_log_reads_back(two_runs, tmp_path):
    log_api = pytest.importorskip("inspect_ai.log")
    path = runs.to_inspect("tools", tmp_path / "logs" / "tools.eval", store=two_runs)
    log = log_api.read_eval_log(str(path))
    assert log.status == "success" and log.eval.task == "tools" and len(log.samples) == 1
    sample = log.samples[0]
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool", "assistant"]
    assert sample.messages[1].tool_calls[0].function == "w" and sample.output.completion == "It is sunny."
    log = log_api.read_eval_log(str(runs.to_inspect("int4", tmp_path / "int4.json", store=two_runs)))
    assert len(log.samples) == 4 and log.samples[1].output.message.tool_calls[0].arguments == {"city": "Lyon"}
    assert log.samples[0].metadata["quantization"] == "int4_mixed" and log.eval.model == "workbench/tiny"
