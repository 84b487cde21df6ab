"""The simulated server's model lookups (simserver/models.py) through the official SDKs: openai's models.retrieve
and models.list, anthropic's models.retrieve and models.list, google-genai's models.get, each parsed into the SDK's
own types; each API's 404 for a model the server does not know (``SimConfig.models``) and its 401/400 for a wrong
key; and that a lookup is not a model request (the counters stay at zero)."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simserver import SimConfig
from tests.helpers import fresh, make_claude, make_gemini, make_openai

pytestmark = pytest.mark.asyncio(loop_scope="module")

UNTOUCHED = {"received": 0, "by_status": {}, "by_route": {"openai": 0, "anthropic": 0, "gemini": 0}}


def untouched(srv) -> bool:
    stats = srv.stats()
    return {key: stats[key] for key in UNTOUCHED} == UNTOUCHED


async def test_every_model_is_known_by_default_in_each_sdks_own_type(srv, oa, claude, gemini):
    model = await oa.models.retrieve("any-model-at-all")
    assert isinstance(model, openai.types.Model) and model.id == "any-model-at-all" and model.object == "model"
    info = await claude.models.retrieve("claude-haiku-4-5")
    assert isinstance(info, anthropic.types.ModelInfo) and info.id == "claude-haiku-4-5" and info.type == "model"
    found = await gemini.aio.models.get(model="gemini-2.0-flash")
    assert isinstance(found, genai_types.Model) and found.name == "models/gemini-2.0-flash"
    assert "generateContent" in (found.supported_actions or [])
    assert untouched(srv)


async def test_the_models_knob_makes_the_others_unknown_in_each_apis_words(srv, oa, claude, gemini):
    fresh(srv, models=["sim-a", "claude-b", "gemini-c"])
    assert (await oa.models.retrieve("sim-a")).id == "sim-a"
    with pytest.raises(openai.NotFoundError) as oa_info:
        await oa.models.retrieve("sim-z")
    assert oa_info.value.body["code"] == "model_not_found" and "`sim-z` does not exist" in oa_info.value.body["message"]
    assert (await claude.models.retrieve("claude-b")).id == "claude-b"
    with pytest.raises(anthropic.NotFoundError) as claude_info:
        await claude.models.retrieve("claude-z")
    assert claude_info.value.body["error"] == {"type": "not_found_error", "message": "model: claude-z"}
    assert (await gemini.aio.models.get(model="gemini-c")).name == "models/gemini-c"
    with pytest.raises(genai_errors.ClientError) as gemini_info:
        await gemini.aio.models.get(model="gemini-z")
    assert gemini_info.value.code == 404 and gemini_info.value.status == "NOT_FOUND"
    assert "models/gemini-z" in gemini_info.value.message
    assert untouched(srv)


async def test_the_lists_name_the_known_models(srv, oa, claude):
    fresh(srv, models="sim-a,sim-b")
    assert [m.id async for m in oa.models.list()] == ["sim-a", "sim-b"]
    assert [m.id async for m in claude.models.list()] == ["sim-a", "sim-b"]
    fresh(srv)
    assert "sim-model" in [m.id async for m in oa.models.list()]


async def test_gemini_v1_lookups_share_the_path_with_openais_and_go_by_the_key_header(srv):
    fresh(srv, models="gemini-c")
    client = make_gemini(srv, version="v1")
    try:
        assert (await client.aio.models.get(model="gemini-c")).name == "models/gemini-c"
        with pytest.raises(genai_errors.ClientError) as info:
            await client.aio.models.get(model="other")
        assert "API version v1." in info.value.message
    finally:
        await client.aio.aclose()


async def test_a_wrong_key_gets_each_apis_refusal_as_on_the_model_routes(srv):
    fresh(srv, api_key="the-right-key")
    oa, claude, gemini = make_openai(srv, "wrong"), make_claude(srv, "wrong"), make_gemini(srv, "wrong")
    try:
        with pytest.raises(openai.AuthenticationError):
            await oa.models.retrieve("sim-model")
        with pytest.raises(anthropic.AuthenticationError):
            await claude.models.retrieve("claude-haiku-4-5")
        with pytest.raises(genai_errors.ClientError) as info:
            await gemini.aio.models.get(model="gemini-2.0-flash")
        assert info.value.code == 400 and "API key not valid" in info.value.message
        right = make_openai(srv, "the-right-key")
        assert (await right.models.retrieve("sim-model")).id == "sim-model"
        await right.close()
    finally:
        await oa.close()
        await claude.close()
        await gemini.aio.aclose()
    assert untouched(srv)


async def test_the_models_knob_is_checked():
    assert SimConfig(models="a,b").models == "a,b"
    with pytest.raises(ValueError, match="models"):
        SimConfig(models="")
    from simserver.config import checked_updates

    assert checked_updates({"models": ["a", "b"]}) == {"models": "a,b"}
    with pytest.raises(ValueError, match="models must be"):
        checked_updates({"models": ["a,b"]})
