"""The OpenAI Batch API on workbench.serve and ``python -m workbench batch``, driven by the official clients.

Every answer in an output file is compared with the same request made in-process on the same engine (greedy),
so the tests hold a batch line to "exactly what the endpoint answers alone"; the restart test kills a real
server process mid-batch and checks that a new process finishes the batch without recomputing the lines
already written.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import workbench as wb
from workbench.batches.cli import done_ids
from workbench.serve import serve
from workbench.serve.batch_main import batch_run_name

openai = pytest.importorskip("openai")
pytest.importorskip("python_multipart")

CITIES = ["Paris", "Tokyo", "Oslo", "Lima", "Cairo", "Rome", "Quito", "Hanoi"]


def chat_line(i: int, **body) -> dict:
    messages = [{"role": "user", "content": f"What's the weather in {CITIES[i % len(CITIES)]}?"}]
    return {
        "custom_id": f"chat-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": messages, "max_tokens": 8, **body},
    }


def jsonl(lines: list) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


@pytest.fixture(scope="module")
def engine():
    return wb.load()


@pytest.fixture(scope="module")
def srv(engine, tmp_path_factory):
    server = serve(engine, port=0, data_dir=tmp_path_factory.mktemp("batches"), max_file_bytes=2**20)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


def wait_done(client, batch_id: str, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    batch = client.batches.retrieve(batch_id)
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)
        batch = client.batches.retrieve(batch_id)
    return batch


def lines_of(client, file_id: str) -> dict[str, dict]:
    return {line["custom_id"]: line for line in map(json.loads, client.files.content(file_id).text.splitlines())}


def expected_chat(engine, line: dict) -> tuple[str, int]:
    body = line["body"]
    ref = engine.chat_completion(body["messages"], max_tokens=body["max_tokens"])
    return ref.message.content, len(ref.tokens)


# --------------------------------------------------------------------------------------------- end to end
def test_batch_end_to_end_with_the_official_client(srv, client, engine):
    good = [chat_line(i) for i in range(20)]
    bad = [
        "{not json",
        {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {}},
        {
            "custom_id": "no-content",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user"}], "max_tokens": 4},
        },
        {
            "custom_id": "too-long",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6},
        },
        {**chat_line(0), "custom_id": "chat-0"},  # a duplicate custom_id
    ]
    upload = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(good + bad))), purpose="batch")
    assert (upload.purpose, upload.status, upload.bytes) == ("batch", "processed", len(jsonl(good + bad)))
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"sweep": "demo"}
    )
    assert batch.status == "validating" and batch.metadata == {"sweep": "demo"}
    batch = wait_done(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (25, 20, 5)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    outputs = lines_of(client, batch.output_file_id)
    assert sorted(outputs) == sorted(line["custom_id"] for line in good)
    for line in good:
        response = outputs[line["custom_id"]]["response"]
        content, tokens = expected_chat(engine, line)
        assert response["status_code"] == 200
        assert response["body"]["choices"][0]["message"]["content"] == content
        assert response["body"]["usage"]["completion_tokens"] == tokens
    errors = list(map(json.loads, client.files.content(batch.error_file_id).text.splitlines()))
    assert len(errors) == 5
    by_id = {e["custom_id"]: e for e in errors}
    assert by_id[None]["error"]["code"] == "invalid_json" and by_id[None]["response"] is None
    assert by_id["wrong-url"]["error"]["code"] == "invalid_url"
    assert by_id["no-content"]["response"]["status_code"] == 400
    assert by_id["no-content"]["response"]["body"]["error"]["param"] == "messages[0].content"
    assert by_id["too-long"]["response"]["body"]["error"]["param"] == "max_tokens"
    assert "2048" in by_id["too-long"]["response"]["body"]["error"]["message"]
    assert by_id["chat-0"]["error"]["code"] == "duplicate_custom_id"
    # rows ran as engine batches: one engine call held more rows than the engine's max_batch_size
    assert srv.stats.largest_batch >= 20 > engine.max_batch_size
    # listing, and the same batch and files under Llama Stack's OpenAI prefix
    assert batch.id in [b.id for b in client.batches.list()]
    prefixed = openai.OpenAI(base_url=srv.url + "/openai/v1", api_key="unused", max_retries=0)
    assert prefixed.batches.retrieve(batch.id).output_file_id == batch.output_file_id
    assert {f.id for f in prefixed.files.list()} >= {upload.id, batch.output_file_id, batch.error_file_id}
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_completions_batch(client, engine):
    prompts = ["Once upon a time", "The capital of France is", "Hello"]
    lines = [
        {
            "custom_id": f"p{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": p, "max_tokens": 6, "logprobs": 2},
        }
        for i, p in enumerate(prompts)
    ]
    upload = client.files.create(file=("c.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = wait_done(
        client, client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h").id
    )
    assert batch.status == "completed" and batch.error_file_id is None
    outputs = lines_of(client, batch.output_file_id)
    refs = engine.batch_completion(prompts, max_tokens=6, logprobs=2)
    for i, ref in enumerate(refs):
        choice = outputs[f"p{i}"]["response"]["body"]["choices"][0]
        assert choice["text"] == ref.text
        assert choice["logprobs"]["token_logprobs"] == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)


def test_cancel_and_interactive_requests_are_not_starved(engine, tmp_path):
    """A long batch (chunks of 2 rows) is cancelled mid-way; meanwhile an interactive request is answered
    while the batch is still running."""
    expected = engine.chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4).message.content
    with serve(engine, port=0, data_dir=tmp_path, batch_rows=2) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        lines = [chat_line(i, max_tokens=32) for i in range(400)]  # long enough to outlast the interactive request
        upload = client.files.create(file=("long.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        while client.batches.retrieve(batch.id).request_counts.completed < 2:
            time.sleep(0.02)
        reply = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.choices[0].message.content == expected
        assert client.batches.retrieve(batch.id).status == "in_progress"  # answered before the batch ended
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = wait_done(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        finished = done.request_counts.completed
        assert 2 <= finished < 400
        assert len(lines_of(client, done.output_file_id)) == finished
        assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing


def test_bad_batch_requests_are_4xx(client, srv):
    upload = client.files.create(file=("x.jsonl", io.BytesIO(jsonl([chat_line(0)]))), purpose="batch")
    for kwargs, param in (
        ({"input_file_id": "file-" + "0" * 24}, "input_file_id"),
        ({"input_file_id": upload.id, "completion_window": "1h"}, "completion_window"),
        ({"input_file_id": upload.id, "endpoint": "/v1/responses"}, "endpoint"),
    ):
        body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", **kwargs}
        response = httpx.post(srv.url + "/batches", json=body, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert httpx.get(srv.url + "/batches/batch_nope", timeout=30).status_code == 404
    assert httpx.get(srv.url + "/files/..%2F..%2Fetc%2Fpasswd", timeout=30).status_code == 404
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    with pytest.raises(openai.APIStatusError) as too_big:  # this server takes uploads up to 1 MiB
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (2 * 2**20))), purpose="batch")
    assert too_big.value.status_code == 413
    assert client.models.list().data  # still serving


# --------------------------------------------------------------------------------------------- restart
def _start_server(data_dir: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(wb.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.serve", "--port", "0", "--data-dir", str(data_dir), "--batch-rows", "2"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    found = re.search(r"(http://\S+/v1)", line)
    assert found, f"the server did not start: {line!r}"
    return proc, found.group(1)


def rows_per_session(run: str) -> list[int]:
    """Rows of a run in the run store, per session (the processes that computed them, in order)."""
    counts: dict[int, int] = {}
    for row in wb.runs.store().rows(run):
        counts[row.session] = counts.get(row.session, 0) + 1
    return [counts[k] for k in sorted(counts)]


@pytest.mark.slow
def test_server_killed_mid_batch_resumes_after_restart(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))  # the servers' (and this test's) store
    lines = [chat_line(i, max_tokens=12) for i in range(32)]
    for i, line in enumerate(lines):  # every request its own: each is one row of the run store
        line["body"]["messages"][0]["content"] += f" ({i})"
    proc, url = _start_server(tmp_path)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        while (done := client.batches.retrieve(batch.id).request_counts.completed) < 4:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert done < len(lines), "the batch finished before the kill: nothing to resume"
    finally:
        proc.kill()
        proc.wait(30)
    run = wb.batches.run_name(batch.id)
    stored = sum(rows_per_session(run))
    assert stored >= done and wb.runs.store().integrity_check() == "ok"  # every written line's row, maybe more
    proc, url = _start_server(tmp_path)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        finished = wait_done(client, batch.id)
        assert finished.status == "completed" and finished.request_counts.completed == len(lines)
        state = finished.model_extra["workbench"]
        assert state["restarts"] == 1 and state["recovered"] >= done
        assert state["computed"] == len(lines)  # no written line was computed twice
        assert rows_per_session(run) == [stored, len(lines) - stored]  # and no stored row either
        outputs = lines_of(client, finished.output_file_id)
        assert sorted(outputs) == sorted(line["custom_id"] for line in lines)
        for line in lines[:6]:
            assert (
                outputs[line["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"]
                == expected_chat(engine, line)[0]
            )
    finally:
        proc.terminate()
        proc.wait(30)


# --------------------------------------------------------------------------------------------- command line
def test_command_line_output_equals_engine_and_resumes(engine, tmp_path, capsys):
    from workbench.__main__ import main

    lines = [chat_line(i) for i in range(10)]
    lines += [
        {"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": p, "max_tokens": 5}}
        for i, p in enumerate(["Once upon a time", "Hello"])
    ]
    lines += [{"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {}}, "{oops"]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(jsonl(lines))
    assert main(["batch", "-i", str(source), "-o", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["requests"], summary["succeeded"], summary["failed"], summary["remaining"]) == (14, 12, 2, 0)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 14
    by_id = {line["custom_id"]: line for line in written}
    for line in lines[:10]:
        assert (
            by_id[line["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"]
            == expected_chat(engine, line)[0]
        )
    for i, prompt in enumerate(["Once upon a time", "Hello"]):
        assert by_id[f"p{i}"]["response"]["body"]["choices"][0]["text"] == engine.completion(prompt, max_tokens=5).text
    assert (
        by_id["bad"]["response"]
        == {"status_code": 400, "request_id": by_id["bad"]["response"]["request_id"], "body": None}
        and "url" in by_id["bad"]["error"]
    )
    assert by_id[None]["error"].startswith("line 14 is not valid JSON")
    assert set(by_id[None]) == {"id", "custom_id", "response", "error"}  # vLLM run-batch's line

    # resume: keep 5 lines and half of the 6th (a write cut by a kill), then run again: the lines lost come back
    # from the run store (run "batch:<output path>"), none recomputed
    run = batch_run_name(out)
    stored = sorted((row.key, row.created_at) for row in wb.runs.store().rows(run))
    assert len(stored) == 8 + 2  # eight cities (requests 8 and 9 repeat 0 and 1) and two prompts
    kept = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(kept[:5]) + kept[5][:20])
    assert main(["batch", "-i", str(source), "-o", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["skipped_done"] == 5 and summary["succeeded"] + summary["failed"] == 9
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(again) == 14 and len({json.dumps(line["custom_id"]) for line in again}) == 14
    assert {
        line["custom_id"]: line["response"]["body"] and line["response"]["body"]["choices"][0]
        for line in again
        if line["custom_id"] and line["custom_id"].startswith("chat")
    } == {
        line["custom_id"]: line["response"]["body"]["choices"][0]
        for line in written
        if line["custom_id"] and line["custom_id"].startswith("chat")
    }
    assert done_ids(out)[0] == {line["custom_id"] for line in lines[:-1]}
    assert sorted((row.key, row.created_at) for row in wb.runs.store().rows(run)) == stored
    assert main(["batch", "-i", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2


# --------------------------------------------------------------------------------------------- sturdier endpoint
def test_oversize_bodies_are_413_and_the_server_keeps_serving(srv, client):
    limit = 16 * 2**20
    response = httpx.post(
        srv.url + "/chat/completions",
        content=b"x" * (limit + 1),
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413 and str(limit) in response.json()["error"]["message"]

    def chunks():  # no content-length: the limit is found while reading
        for _ in range(17):
            yield b"x" * 2**20

    response = httpx.post(srv.url + "/completions", content=chunks(), timeout=60)
    assert response.status_code == 413 and response.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.APIStatusError) as too_big:
        client.chat.completions.create(
            model=srv.model, max_tokens=2, messages=[{"role": "user", "content": "a" * (limit + 10)}]
        )
    assert too_big.value.status_code == 413
    with httpx.Client(timeout=60) as keep_alive:  # one connection: the 413, then a normal request on it
        assert keep_alive.post(srv.url + "/chat/completions", content=b"x" * (limit + 1)).status_code == 413
        assert keep_alive.get(srv.url + "/models").status_code == 200
    assert client.chat.completions.create(
        model=srv.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    ).choices


def test_missing_content_and_max_tokens_beyond_the_context_are_400(srv, client, engine):
    for message, param in (
        ({"role": "user"}, "messages[0].content"),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "assistant"}, "messages[0].content"),
        ({"role": "tool", "tool_call_id": "c"}, "messages[0].content"),
    ):
        response = httpx.post(srv.url + "/chat/completions", json={"messages": [message]}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    hello = [{"role": "user", "content": "Hi"}]
    prompt = len(engine.formatter.encode_dialog(hello))
    room = engine.max_seq_len - prompt
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=srv.model, messages=hello, max_tokens=room + 1)
    error = refused.value.body
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    assert f"at most {room}" in error["message"] and str(engine.max_seq_len) in error["message"]
    assert client.chat.completions.create(model=srv.model, messages=hello, max_tokens=room).choices  # fits exactly
    response = httpx.post(srv.url + "/completions", json={"prompt": "Hi", "max_tokens": 10**7}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    # the Llama Stack routes: a message without content is a 400 as well
    response = httpx.post(srv.url + "/inference/chat-completion", json={"messages": [{"role": "user"}]}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content"
    response = httpx.post(srv.url + "/inference/batch-chat-completion", json={"messages_batch": [[]]}, timeout=30)
    assert response.status_code == 400


def test_concurrent_batches_and_requests_all_finish(srv, client, engine):
    """Two batches created together and a burst of interactive requests: everything completes, exactly."""
    uploads = [
        client.files.create(
            file=(f"b{k}.jsonl", io.BytesIO(jsonl([chat_line(i + k) for i in range(6)]))), purpose="batch"
        )
        for k in range(2)
    ]
    batches = [
        client.batches.create(input_file_id=u.id, endpoint="/v1/chat/completions", completion_window="24h")
        for u in uploads
    ]
    replies: dict[int, str] = {}

    def ask(i: int) -> None:
        messages = chat_line(i)["body"]["messages"]
        replies[i] = (
            client.chat.completions.create(model=srv.model, messages=messages, max_tokens=8).choices[0].message.content
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(replies[i] == expected_chat(engine, chat_line(i))[0] for i in range(4))
    for k, batch in enumerate(batches):
        done = wait_done(client, batch.id)
        outputs = lines_of(client, done.output_file_id)
        assert [
            outputs[f"chat-{i}"]["response"]["body"]["choices"][0]["message"]["content"] for i in range(k, k + 6)
        ] == [expected_chat(engine, chat_line(i))[0] for i in range(k, k + 6)]


def test_the_batch_package_works_without_fastapi(tmp_path):
    """workbench.batches (store, lines, runner, service, the CLI's loop) imports without the serve extra."""
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
        "from workbench.batches import FileStore, parse_line\n"
        "from workbench.batches.cli import run_file\n"
        f"info = FileStore({str(tmp_path)!r}).create(b'{{}}\\n', filename='a.jsonl', purpose='batch')\n"
        'line = \'{"custom_id": "a", "url": "/v1/completions", "body": {}}\'\n'
        "print(info['id'], parse_line(line, 1).url)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(wb.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"file-[0-9a-f]{24} /v1/completions\n", out.stdout)
