"""The `workbench` model provider for Inspect, on the demo model: tasks with tools, config, batching, errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ContentAudio,
    ContentImage,
    ContentText,
    GenerateConfig,
    get_model,
    get_model_info,
)
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import ToolCall, ToolFunction, ToolInfo, ToolParam, ToolParams, tool

import workbench as wb
from workbench.errors import InputError, PromptTooLongError
from workbench.evals.inspect_ai import InspectInputError, sampling_kwargs, to_messages, to_tool
from workbench.evals.inspect_ai.provider import to_tool_choice

CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]


@tool
def get_weather():
    async def execute(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city name.
        """
        return f"It is sunny in {city}."

    return execute


@pytest.fixture(scope="module")
def engine():
    return wb.load()


@pytest.fixture(scope="module")
def model(engine):
    # a generous gathering window: on a loaded CI machine Inspect's samples may reach generate tens of ms apart
    return get_model("workbench/default", engine=engine, memoize=False, batch_window=0.5)


def weather_task() -> Task:
    samples = [Sample(input=f"What is the weather in {city}?", target=city) for city in CITIES]
    return Task(dataset=samples, solver=[use_tools(get_weather()), generate()], scorer=includes())


def test_a_task_with_a_tool_runs_batched_on_the_demo_model(model, tmp_path):
    sizes = model.api.batcher.stats.sizes
    before = len(sizes)
    [log] = eval(weather_task(), model=model, display="none", log_dir=str(tmp_path), max_tokens=48)
    assert log.status == "success", log.error
    called = 0
    for sample in log.samples:
        roles = [m.role for m in sample.messages]
        assert roles[0] == "user" and roles[1] == "assistant"
        first = sample.messages[1]
        if first.tool_calls:
            called += 1
            assert first.tool_calls[0].function == "get_weather"
            assert roles[2] == "tool" and "It is sunny in" in sample.messages[2].text
            assert sample.output.stop_reason in ("stop", "max_tokens")
    assert called >= 1  # the trained demo model calls the tool it is offered
    usage = log.stats.model_usage["workbench/default"]
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    # the 4 concurrent samples were answered together: one engine batch per round, not one call per sample
    assert sizes[before] == len(CITIES)
    assert sum(sizes[before:]) == len(CITIES) + called


def test_concurrent_generate_calls_are_gathered_into_one_batch(model):
    sizes = model.api.batcher.stats.sizes
    before = len(sizes)

    async def many():
        config = GenerateConfig(max_tokens=4)
        return await asyncio.gather(*[model.generate(f"Say {i}", config=config) for i in range(6)])

    outputs = asyncio.run(many())
    assert sizes[before:] == [6]
    alone = asyncio.run(model.generate("Say 3", config=GenerateConfig(max_tokens=4)))
    assert outputs[3].completion == alone.completion  # a row of a batch equals the call run alone


def test_a_refused_dialog_fails_only_its_own_sample(model, engine):
    """The gathered dialogs go to the engine in one chat call; when the engine refuses one (too long), the others
    are still answered and only that sample sees the error."""
    sizes = model.api.batcher.stats.sizes
    before = len(sizes)

    async def both():
        config = GenerateConfig(max_tokens=4)
        return await asyncio.gather(
            model.generate("Say 1", config=config),
            model.generate("snow " * engine.max_seq_len, config=config),
            return_exceptions=True,
        )

    fine, refused = asyncio.run(both())
    assert sizes[before:] == [2]
    assert isinstance(refused, PromptTooLongError) and not isinstance(fine, BaseException)
    assert fine.completion == asyncio.run(model.generate("Say 1", config=GenerateConfig(max_tokens=4))).completion


def test_generate_config_maps_to_the_engines_sampling(model):
    config = GenerateConfig(
        temperature=0.7, top_p=0.9, top_k=20, max_tokens=12, stop_seqs=["\n"], seed=3, logprobs=True, top_logprobs=2
    )
    assert sampling_kwargs(config) == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "max_tokens": 12,
        "stop": ["\n"],
        "seed": 3,
        "logprobs": 2,
    }
    assert sampling_kwargs(GenerateConfig()) == {"temperature": 0.0}  # greedy unless asked

    out = asyncio.run(model.generate("Hi", config=GenerateConfig(max_tokens=3)))  # greedy, it writes 6 tokens
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 3
    assert out.usage.total_tokens == out.usage.input_tokens + 3
    sampled = GenerateConfig(max_tokens=6, temperature=1.0, seed=11, logprobs=True, top_logprobs=2)
    a = asyncio.run(model.generate("Tell me a story.", config=sampled))
    b = asyncio.run(model.generate("Tell me a story.", config=sampled))
    assert a.completion == b.completion  # seeded sampling repeats
    lps = a.choices[0].logprobs.content
    assert len(lps) == a.usage.output_tokens and all(len(lp.top_logprobs) == 2 for lp in lps)


def test_messages_and_tools_render_as_the_same_workbench_dialog(engine):
    call = ToolCall(id="c1", function="get_weather", arguments={"city": "Paris"})
    inspect_msgs = [
        ChatMessageSystem(content="Be brief."),
        ChatMessageUser(content=[ContentText(text="Weather in"), ContentText(text="Paris?")]),
        ChatMessageAssistant(content="", tool_calls=[call]),
        ChatMessageTool(content="Sunny.", tool_call_id="c1", function="get_weather"),
    ]
    info = ToolInfo(
        name="get_weather",
        description="Get the current weather in a city.",
        parameters=ToolParams(
            properties={"city": ToolParam(type="string", description="The city name.")}, required=["city"]
        ),
    )
    ours = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in\nParis?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"tool_name": "get_weather", "arguments": {"city": "Paris"}, "call_id": "c1"}],
        },
        {"role": "tool", "content": "Sunny.", "call_id": "c1"},
    ]
    schema = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    }
    fmt = engine.formatter
    expected = fmt.encode_dialog(ours, tools=[schema])
    assert fmt.encode_dialog(to_messages(inspect_msgs), tools=[to_tool(info)]) == expected
    assert to_tool_choice("any") == "required" and to_tool_choice(ToolFunction("get_weather")) == "get_weather"
    assert to_tool_choice("none") == "none" and to_tool_choice("auto") == "auto"


def test_tool_choice_and_tool_calls_come_back_as_inspect_tool_calls(model):
    info = get_weather()
    choice = ToolFunction("get_weather")
    question = "What is the weather in Paris?"
    out = asyncio.run(model.generate(question, tools=[info], tool_choice=choice, config=GenerateConfig(max_tokens=40)))
    calls = out.message.tool_calls or []
    assert out.stop_reason == ("tool_calls" if calls else "stop") or out.stop_reason == "max_tokens"
    for c in calls:
        assert c.id and c.function == "get_weather" and isinstance(c.arguments, dict)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (GenerateConfig(frequency_penalty=0.5), "cannot honour GenerateConfig frequency_penalty"),
        (GenerateConfig(logit_bias={1: 2.0}), "logit_bias"),
        (GenerateConfig(num_choices=3), "num_choices=3"),
    ],
)
def test_what_the_engine_cannot_do_is_a_clear_error(model, config, message):
    with pytest.raises(InputError, match=message):
        asyncio.run(model.generate("Hi", config=config))


def test_unsupported_content_and_settings_are_clear_errors(engine):
    with pytest.raises(InspectInputError, match="text and images only"):
        to_messages([ChatMessageUser(content=[ContentAudio(audio="a.wav", format="wav")])])
    with pytest.raises(InspectInputError, match="is a URL"):
        to_messages([ChatMessageUser(content=[ContentImage(image="https://example.com/cat.png")])])
    with pytest.raises(InspectInputError, match="give one or the other"):
        get_model("workbench/default", engine=engine, max_batch_size=4, memoize=False)
    with pytest.raises(InspectInputError, match="batch_window"):
        get_model("workbench/default", engine=engine, batch_window=-1, memoize=False)
    with pytest.raises(InspectInputError, match="unknown model arg 'max_batch_sise'.*max_batch_size"):
        get_model("workbench/default", max_batch_sise=4, memoize=False)


def test_providers_load_their_engine_at_first_use_only(engine):
    """Inspect builds throwaway providers to look models up (get_model_info): they must not load weights, which
    would unload the notebook's engine."""
    lookup = get_model("workbench/some-checkpoints-toml-entry", memoize=False)
    get_model_info("workbench/default")
    assert lookup.api._engine is None and wb.current() is engine and not engine.closed


def test_the_provider_is_registered_through_the_inspect_ai_entry_point():
    [ep] = [e for e in entry_points(group="inspect_ai") if e.name == "workbench"]
    assert ep.value == "workbench.evals.inspect_ai._registry"


@pytest.mark.slow
def test_inspect_eval_command_line_with_a_workbench_model(tmp_path):
    (tmp_path / "weather_task.py").write_text(
        textwrap.dedent("""
        from inspect_ai import Task, task
        from inspect_ai.dataset import Sample
        from inspect_ai.scorer import includes
        from inspect_ai.solver import generate

        @task
        def hello():
            return Task(dataset=[Sample(input="Hi", target="")], solver=[generate()], scorer=includes())
    """)
    )
    inspect = Path(sys.executable).with_name("inspect")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            str(inspect),
            "eval",
            "weather_task.py",
            "--model",
            "workbench/default",
            "--max-tokens",
            "4",
            "--log-dir",
            "logs",
            "--display",
            "plain",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "workbench/default" in done.stdout and list((tmp_path / "logs").iterdir())
