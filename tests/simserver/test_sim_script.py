"""Response scripts for the simulated server (simserver.script): which entry answers a request, what is
served in turn, how a scripted text goes through the normal answer machinery, and load errors. Requests are
rendered from the template files under tests/data/sim_script/prompts and sent through the official SDKs over
127.0.0.1 only."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import jinja2
import openai
import pytest
import yaml
from google import genai
from google.genai import types as genai_types

from simserver import SimConfig, SimServer, simulated_reply
from simserver import cli as simserver_cli
from simserver.script import ScriptError, load_script, longest_piece
from tests.helpers import fresh, make_openai

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "sim_script"
PROMPTS = DATA / "prompts"
PIPELINE = DATA / "scripts" / "pipeline.yaml"
WOKELY = "Wokely means in an alert and socially aware manner."

pytestmark = pytest.mark.asyncio(loop_scope="module")


def render(template: str, **values: Any) -> list[dict[str, str]]:
    """The OpenAI messages a runner stage sends for this template file and these values."""
    data = yaml.safe_load((PROMPTS / f"{template}.yaml").read_text(encoding="utf-8"))
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def text(source: str) -> str:
        return env.from_string(source).render(values)

    messages = [{"role": "system", "content": text(data["system"])}] if data.get("system") else []
    messages += [{"role": turn["role"], "content": text(turn["content"])} for turn in data.get("messages", [])]
    return messages + [{"role": "user", "content": text(data["user"])}]


def deduce(term: str = "wokely", **values: Any) -> list[dict[str, str]]:
    return render("newterm/build/deduce", term=term, hint=values.pop("hint", ""),
                  examples=values.pop("examples", f"She answered {term}."), **values)


def judge(sentence: str, term: str = "wokely") -> list[dict[str, str]]:
    return render("newterm/build/judge", term=term, sentence=sentence)


def write_script(tmp_path: Path, text: str, name: str = "script.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"{text}prompts: {json.dumps(str(PROMPTS))}\n", encoding="utf-8")  # text's lines keep their numbers
    return path


async def ask(oa: openai.AsyncOpenAI, messages: list[dict[str, str]], model: str = "sim-a",
              **params: Any) -> str | None:
    completion = await oa.chat.completions.create(model=model, messages=messages, **params)  # type: ignore[arg-type]
    return completion.choices[0].message.content


@pytest.fixture
def srv(shared_srv: SimServer) -> SimServer:
    """The module's server with the default config and the pipeline script loaded afresh, counters zeroed."""
    fresh(shared_srv, script=str(PIPELINE))
    return shared_srv


# -- matching -------------------------------------------------------------------------------------------------


async def test_longest_literal_piece_skips_tags_and_strips() -> None:
    assert longest_piece('{% if x %}Given "{{ t }}".{% endif %}  Answer in one word please. {# c #}x') == \
        "Answer in one word please."
    assert longest_piece("{{ a }}{# a long comment that is not text #}{{ b }}") == ""
    assert longest_piece("{%- raw -%}\n  kept as written  \n{%- endraw %}") == "kept as written"


async def test_template_and_term_pick_the_entry(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    assert await ask(oa, deduce("wokely")) == WOKELY
    assert await ask(oa, deduce("wokely", hint="it is an adverb")) == WOKELY  # the {% if %} branch
    assert await ask(oa, deduce("blorptastic")) == "first deduction"  # the template entry without a term
    # The judge template is not the deduce template, although the term is there.
    assert await ask(oa, judge("He spoke wokely.")) == "no"
    assert srv.stats()["scripted"] == 4 and srv.stats()["unmatched"] == 0


async def test_every_string_of_the_template_must_be_recognised(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    messages = deduce("wokely")
    without_system = messages[1:]
    reworded = [*messages[:-1], {"role": "user", "content": "What does wokely mean? Answer:"}]
    for messages in (without_system, reworded):
        answer = await ask(oa, messages)
        assert answer == simulated_reply("sim-a", messages)[0] and answer != WOKELY
    assert srv.stats()["unmatched"] == 2 and srv.stats()["scripted"] == 0


async def test_contains_and_model(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    effect = judge("As an effect of the storm, she spoke wokely.")
    assert await ask(oa, effect, model="judge-model") == "yes"
    assert await ask(oa, effect, model="other-model") == "no"  # model: does not hold
    assert await ask(oa, judge("She spoke wokely.", "wokely"), model="judge-model") == "no"  # contains: fails


async def test_responses_are_served_in_turn_and_the_last_repeats(srv: SimServer,
                                                                 oa: openai.AsyncOpenAI) -> None:
    answers = [await ask(oa, deduce(f"term{i}")) for i in range(4)]
    assert answers == ["first deduction", "second deduction", "second deduction", "second deduction"]
    srv.reset()  # rewinds every entry
    assert await ask(oa, deduce("term0")) == "first deduction"


async def test_concurrent_requests_each_get_their_own_turn(tmp_path: Path, srv: SimServer,
                                                           oa: openai.AsyncOpenAI) -> None:
    script = write_script(tmp_path, "responses:\n  - template: newterm/build/deduce\n"
                                    "    responses: [one, two, three]\n")
    srv.configure(script=str(script), latency=0.05)
    answers = await asyncio.gather(*(ask(oa, deduce(f"t{i}")) for i in range(6)))
    assert sorted(answers) == sorted(["one", "two", "three", "three", "three", "three"])  # type: ignore[type-var]
    assert srv.stats()["scripted"] == 6


async def test_first_matching_entry_in_file_order_wins(tmp_path: Path, srv: SimServer,
                                                       oa: openai.AsyncOpenAI) -> None:
    general = "  - template: newterm/build/deduce\n    response: general\n"
    specific = "  - template: newterm/build/deduce\n    term: wokely\n    response: specific\n"
    srv.configure(script=str(write_script(tmp_path, "responses:\n" + general + specific)))
    assert await ask(oa, deduce("wokely")) == "general"
    srv.configure(script=str(write_script(tmp_path, "responses:\n" + specific + general)))
    assert await ask(oa, deduce("wokely")) == "specific"
    assert await ask(oa, deduce("other")) == "general"


async def test_multi_turn_request_matched_by_its_assistant_turn(tmp_path: Path, srv: SimServer,
                                                                oa: openai.AsyncOpenAI) -> None:
    script = write_script(tmp_path, "responses:\n  - contains: [\"My earlier guess: a dance\"]\n"
                                    "    response: revised guess\n")
    srv.configure(script=str(script))
    turns = [{"role": "system", "content": "You revise definitions."},
             {"role": "user", "content": "What does wokely mean?"},
             {"role": "assistant", "content": "My earlier guess: a dance move."},
             {"role": "user", "content": "Are you sure? Try again."}]
    assert await ask(oa, turns) == "revised guess"
    no_assistant = [turns[0], turns[1], turns[3]]
    assert await ask(oa, no_assistant) == simulated_reply("sim-a", no_assistant)[0]
    # The template's assistant turn is one of its strings too: the deduce entries need it.
    without_turn = [m for m in deduce("wokely") if m["role"] != "assistant"]
    srv.configure(script=str(PIPELINE))
    assert await ask(oa, without_turn) != WOKELY
    assert srv.stats()["unmatched"] == 2


async def test_unmatched_request_gets_the_simulated_answer(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "Something no entry knows about."}]
    assert await ask(oa, messages, temperature=0) == simulated_reply("sim-a", messages, temperature=0)[0]
    stats = srv.stats()
    assert stats["unmatched"] == 1 and stats["scripted"] == 0 and stats["by_status"] == {"200": 1}


async def test_strict_script_rejects_unmatched_requests_in_each_format(tmp_path: Path, srv: SimServer,
                                                                       oa: openai.AsyncOpenAI) -> None:
    script = write_script(tmp_path, "strict: true\nresponses:\n  - term: wokely\n    response: ok\n")
    srv.configure(script=str(script))
    assert await ask(oa, deduce("wokely")) == "ok"
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(oa, deduce("other"))
    assert caught.value.status_code == 400
    assert caught.value.body["message"] == "no scripted response matches this request"  # type: ignore[index]
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.post(srv.root_url + "/v1/messages", headers={"x-api-key": "k",
                                                                        "anthropic-version": "2023-06-01"}, json={
                "model": "sim-a", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"] == {"type": "invalid_request_error",
                                                    "message": "no scripted response matches this request"}
        async with session.post(srv.root_url + "/v1beta/models/sim-a:generateContent",
                                headers={"x-goog-api-key": "k"},
                                json={"contents": [{"parts": [{"text": "hello"}]}]}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["status"] == "INVALID_ARGUMENT"
            assert error["message"] == "no scripted response matches this request"
    stats = srv.stats()
    assert stats["by_status"] == {"200": 1, "400": 3} and stats["unmatched"] == 3 and stats["scripted"] == 1
    assert len(stats["completed_by_digest"]) == 1


# -- the answer machinery ---------------------------------------------------------------------------------------


async def test_scripted_answer_through_each_sdk(srv: SimServer) -> None:
    """The same multi-turn conversation, with its system prompt in each format's own place."""
    system, *turns = deduce("wokely")
    openai_sdk = make_openai(srv)
    claude = anthropic.AsyncAnthropic(base_url=srv.root_url, api_key="test-key", max_retries=0,
                                      http_client=anthropic.DefaultAioHttpClient())
    gemini = genai.Client(api_key="test-key", http_options=genai_types.HttpOptions(  # v1 has no systemInstruction
        base_url=srv.root_url, api_version="v1beta", retry_options=genai_types.HttpRetryOptions(attempts=1)))
    try:
        via_openai = await openai_sdk.chat.completions.create(
            model="gpt-4o-mini", messages=[system, *turns], max_tokens=50)  # type: ignore[list-item]
        via_claude = await claude.messages.create(
            model="claude-haiku-4-5", max_tokens=50, system=[{"type": "text", "text": system["content"]}],
            messages=turns)  # type: ignore[arg-type]
        via_gemini = await gemini.aio.models.generate_content(
            model="gemini-2.0-flash",
            contents=[genai_types.Content(role="model" if m["role"] == "assistant" else "user",
                                          parts=[genai_types.Part(text=m["content"])]) for m in turns],
            config=genai_types.GenerateContentConfig(system_instruction=system["content"], max_output_tokens=50))
    finally:
        await openai_sdk.close()
        await claude.close()
        await gemini.aio.aclose()
    assert via_openai.choices[0].message.content == WOKELY and via_openai.choices[0].finish_reason == "stop"
    assert via_openai.usage is not None and via_openai.usage.completion_tokens == (len(WOKELY) + 3) // 4
    assert [b.text for b in via_claude.content] == [WOKELY] and via_claude.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert via_claude.usage.output_tokens == via_openai.usage.completion_tokens
    assert via_claude.usage.input_tokens == via_openai.usage.prompt_tokens
    assert via_gemini.text == WOKELY
    assert via_gemini.candidates[0].finish_reason == genai_types.FinishReason.STOP  # type: ignore[index]
    stats = srv.stats()
    assert stats["scripted"] == 3 and stats["by_route"] == {"openai": 1, "anthropic": 1, "gemini": 1}
    assert list(stats["completed_by_digest"].values()) == [3]  # one conversation in all three formats


async def test_max_tokens_and_stop_cut_a_scripted_answer(srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    completion = await oa.chat.completions.create(model="sim-a", messages=deduce("wokely"),  # type: ignore[arg-type]
                                                      max_tokens=3)
    assert completion.choices[0].message.content == "Wokely means in"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    cut = await oa.chat.completions.create(model="sim-a", messages=deduce("wokely"), stop=[" alert"])  # type: ignore[arg-type]
    assert cut.choices[0].message.content == "Wokely means in an" and cut.choices[0].finish_reason == "stop"


async def test_rate_limits_and_faults_apply_and_only_delivered_answers_take_a_turn(
        srv: SimServer, oa: openai.AsyncOpenAI) -> None:
    srv.configure(fault_500=1.0)
    with pytest.raises(openai.InternalServerError):
        await ask(oa, deduce("t1"))
    srv.configure(fault_500=0.0, fault_filter=1.0)
    filtered = await oa.chat.completions.create(model="sim-a", messages=deduce("t1"))  # type: ignore[arg-type]
    assert filtered.choices[0].finish_reason == "content_filter" and filtered.choices[0].message.content is None
    srv.configure(fault_filter=0.0, rpm=2)
    assert await ask(oa, deduce("t1")) == "first deduction"  # the failed and filtered tries took no turn
    assert await ask(oa, deduce("t2")) == "second deduction"
    with pytest.raises(openai.RateLimitError):
        await ask(oa, deduce("t3"))
    stats = srv.stats()
    assert stats["by_status"] == {"500": 1, "200": 3, "429": 1} and stats["scripted"] == 2


# -- loading --------------------------------------------------------------------------------------------------


async def test_config_endpoint_loads_and_drops_a_script(tmp_path: Path, srv: SimServer,
                                                        oa: openai.AsyncOpenAI) -> None:
    async def post_config(body: Any) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.post(srv.root_url + "/sim/config",
                                                                    json=body) as resp:
            return resp.status, await resp.json()

    other = write_script(tmp_path, "responses:\n  - term: wokely\n    response: from the new script\n")
    status, shown = await post_config({"script": str(other)})
    assert status == 200 and shown["script"] == str(other)
    assert await ask(oa, deduce("wokely")) == "from the new script"
    bad = write_script(tmp_path, "responses:\n  - term: wokely\n", name="bad.yaml")
    status, body = await post_config({"script": str(bad)})
    assert status == 400 and str(bad) in body["error"]["message"] and "responses[0]" in body["error"]["message"]
    assert srv.config.script == str(other)  # a script that fails to load changes nothing
    assert await ask(oa, deduce("wokely")) == "from the new script"
    status, shown = await post_config({"script": None})
    assert status == 200 and shown["script"] is None
    assert await ask(oa, deduce("wokely")) == simulated_reply("sim-a", deduce("wokely"))[0]
    assert "scripted" not in srv.stats() and "unmatched" not in srv.stats()


async def test_prompts_folder_defaults_to_the_parent_then_the_scripts_own(tmp_path: Path) -> None:
    assert len(load_script(PIPELINE).entries) == 4  # ../prompts next to the scripts folder
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "mine.yaml").write_text("user: 'A question long enough: {{ q }}'\n")
    (tmp_path / "script.yaml").write_text("responses:\n  - template: mine\n    response: x\n")
    assert load_script(tmp_path / "script.yaml").entries[0].needles == ("A question long enough:",)


@pytest.mark.parametrize(("body", "problem"), [
    ("responses: []\nstrict: true: false\n", "not valid YAML at line 2: mapping values are not allowed here"),
    ("strict: yes please\nresponses: []\n", "strict must be true or false"),
    ("respones: []\n", "unknown key 'respones'"),
    ("responses:\n  - response: a\n  - term: x\n    respnse: b\n", "responses[1] (line 3): unknown key 'respnse'"),
    ("responses:\n  - response: a\n  - term: x\n", "responses[1] (line 3): give either response:"),
    ("responses:\n  - response: a\n    responses: [b]\n", "responses[0] (line 2): give either response: (one "
                                                          "text) or responses: (a list), not both"),
    ("responses:\n  - response: 42\n", 'responses[0] (line 2): response must be a string (quote it: "42")'),
    ("responses:\n  - contains: As an effect\n    response: a\n", "contains must be a list of strings"),
    ("responses:\n  - responses: []\n", "responses must be a non-empty list of strings"),
    ("responses:\n  - term: ''\n    response: a\n", "must not be empty"),
    ("responses:\n  - response: a\n  - template: newterm/build/nothing\n    response: b\n",
     "responses[1] (line 3): template 'newterm/build/nothing'"),
    ("responses:\n  - template: bare\n    response: a\n", "no literal text of 8 or more characters"),
])
async def test_script_errors_name_the_file_and_the_entry(tmp_path: Path, body: str, problem: str) -> None:
    path = write_script(tmp_path, body)
    with pytest.raises(ScriptError) as caught:
        load_script(path)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert message.startswith(f"response script {path}") and problem in message and "\n" not in message
    if "nothing" in body:
        assert message.endswith("does not exist")


async def test_unreadable_script_and_missing_prompts_folder(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="cannot read it"):
        load_script(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("[1, 2]\n")
    with pytest.raises(ScriptError, match="list.yaml: expected a mapping with a responses: list"):
        load_script(tmp_path / "list.yaml")
    (tmp_path / "s.yaml").write_text("prompts: nowhere\nresponses: []\n")
    with pytest.raises(ScriptError, match="prompts folder .*nowhere does not exist"):
        load_script(tmp_path / "s.yaml")
    (tmp_path / "t.yaml").write_text("responses:\n  - template: x\n    response: a\n")
    with pytest.raises(ScriptError, match=r"responses\[0\] \(line 2\): template 'x' needs a prompts folder"):
        load_script(tmp_path / "t.yaml")
    with pytest.raises(ScriptError):
        SimServer(SimConfig(script=str(tmp_path / "missing.yaml")))


async def test_script_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SimConfig] = []
    monkeypatch.setattr(simserver_cli, "serve", lambda host, port, config: seen.append(config))
    simserver_cli.main(["--port", "0", "--script", str(PIPELINE)])
    assert seen == [SimConfig(script=str(PIPELINE))]


async def test_command_line_reports_a_bad_script_in_one_line(tmp_path: Path) -> None:
    bad = write_script(tmp_path, "responses:\n  - response: a\n  - template: 7\n    response: b\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simserver", "--port", "0", "--script", str(bad), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 2 and out == b""
    assert err.decode() == (f"python -m simserver: error: response script {bad}, responses[1] (line 3): "
                            'template must be a string (quote it: "7")\n')
