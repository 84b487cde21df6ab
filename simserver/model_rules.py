"""The simulated server's own rules per model: what each model family's API takes, written for this server from the
providers' published documents, SDK types and model pages, each rule naming where it comes from. Strict mode
(:mod:`simserver.strict_openai`, :mod:`simserver.strict_anthropic`, :mod:`simserver.strict_gemini`,
:mod:`simserver.bedrock_strict`) and the formats' defaults (which models think unasked) read them through
:func:`facts`; nothing here comes from the runner's capability table, so that a wrong entry there is refused here
rather than echoed (tests/simserver/test_model_rules.py compares the two tables on every model both know).

A rule states only what its sources say: a fact it leaves out is not checked (and not compared). The facts, named
as the runner's table names them: ``temperature`` (a range, or None: refused), ``top_p``, ``temperature_with_top_p``,
``penalties`` (presence/frequency), ``max_stop`` (0: no stop sequences), ``seed`` (a range), ``logprobs``,
``reasoning`` (never, optional, default, always), ``efforts`` (the effort levels taken), ``budget`` (the range of a
non-zero thinking budget; an upper bound of None: the model's output cap bounds it), ``budget_zero_off``,
``schema`` (structured outputs with a JSON Schema), ``json_mode``, ``thinking_omitted`` (Claude's thinking text
left out unless asked) and ``max_output`` (from :data:`OUTPUT_LIMITS`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANTHROPIC_VERSIONS", "CONVERSE_EFFORTS", "Facts", "RULES", "facts"]

#: the ``anthropic-version`` header values the Messages API takes (platform.claude.com/docs/en/api/versioning)
ANTHROPIC_VERSIONS = ("2023-06-01", "2026-10-21")
#: the values of Converse's ``outputConfig.effort``, in the documentation of botocore's bedrock-runtime service model
#: (``OutputConfig.effort``: "Supported values are low, medium, high, xhigh, and max"; its shape is a string of 0 to 16
#: characters, with no enum)
CONVERSE_EFFORTS = ("low", "medium", "high", "xhigh", "max")

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_DATED = r"(?:-\d{4}-\d\d-\d\d)?$"


@dataclass(frozen=True, slots=True)
class ModelRule:
    """What one model family's API takes, as its sources say."""

    api: str  #: openai (Chat Completions), anthropic (Messages), gemini (generateContent), converse (Bedrock)
    pattern: str  #: matched with ``re.match`` against the model id (Claude on Vertex with ``@`` read as ``-``)
    family: str
    source: str
    facts: Mapping[str, Any]


# -- OpenAI Chat Completions ------------------------------------------------------------------------------------
_OAI_DOC = ("OpenAI OpenAPI document, CreateChatCompletionRequest (published/openai_chat_request.json): temperature "
            "0-2, seed int64, stop at most 4")
_OAI_REASONING = ("OpenAI reasoning guide (platform.openai.com/docs/guides/reasoning): reasoning models take "
                  "max_completion_tokens and reasoning_effort, no temperature or top_p but their default 1, no "
                  "presence or frequency penalty, no logprobs; no stop before gpt-5.5")
_OAI_EFFORTS = ("openai/openai-ruby lib/openai/models/reasoning_effort.rb at cdafc127 (the OpenAPI description): "
                "models before gpt-5.1 default to medium and take no none; gpt-5.1 takes none, low, medium and high; "
                "gpt-5-pro only high; xhigh the models after gpt-5.1-codex-max")
_OAI_O1_MINI = ("OpenAI API reference, reasoning_effort: 'o1 and o3-mini' on (quoted in dzhng/deep-research#89); "
                "o1-mini answers 'Unknown parameter: reasoning_effort' (BerriAI/litellm#11819); the o1-preview and "
                "o1-mini beta limits in the reasoning guide of 2024-09: no response_format")
_OAI_FORMATS = ("OpenAI API reference, response_format (the OpenAPI document before the Responses API): 'Compatible "
                "with GPT-4o, GPT-4o mini, GPT-4 Turbo and all GPT-3.5 Turbo models newer than gpt-3.5-turbo-1106'; "
                "Structured Outputs guide: json_schema from gpt-4o-2024-08-06 and gpt-4o-mini on")
_REASONS = {"temperature": None, "top_p": False, "penalties": False, "logprobs": False}
#: what the chat models take (the OpenAPI document's ranges)
_SAMPLES = {"temperature": (0.0, 2.0), "top_p": True, "penalties": True}

# -- Anthropic Messages ---------------------------------------------------------------------------------------
_ANT_REF = ("Anthropic Messages API reference and the anthropic SDK's MessageCreateParams: temperature 0-1, no "
            "presence or frequency penalty, no seed, no logprobs")
_ANT_ADAPTIVE = ("Amazon Bedrock user guide, Claude adaptive thinking (docs.aws.amazon.com/bedrock/latest/userguide/"
                 "claude-messages-adaptive-thinking.html): Claude Mythos, Fable and Opus 4.7 take only adaptive "
                 "thinking with output_config.effort; thinking.type enabled or disabled is a 400; Opus 4.6 and "
                 "Sonnet 4.6 take both forms; older models only enabled with budget_tokens")
_ANT_47 = ("Anthropic models overview and the Claude Opus 4.7 migration guide (platform.claude.com/docs/en/about-"
           "claude/models): no temperature, top_p or top_k; effort low to max with xhigh; thinking display omitted "
           "by default; structured outputs")
_ANT_EFFORT = "Anthropic effort (platform.claude.com/docs/en/build-with-claude/effort): low, medium, high, max on 4.6"
_ANT_THINKING = ("Anthropic extended thinking (platform.claude.com/docs/en/build-with-claude/extended-thinking): "
                 "budget_tokens at least 1024 and below max_tokens, on Claude 3.7 Sonnet and the Claude 4 models")
_ANT_TOP_P = ("Amazon Bedrock user guide, Claude request and response: 'Claude Sonnet 4.5 and Claude Haiku 4.5 "
              "support specifying either the temperature or top_p parameter, but not both'")
_ANT_SCHEMA = ("Anthropic structured outputs (platform.claude.com/docs/en/build-with-claude/structured-outputs): "
               "output_config.format on Opus 4.1, Sonnet 4.5, Haiku 4.5, Opus 4.5 and later")

# -- Gemini generateContent ------------------------------------------------------------------------------------
_GEM_DOC = ("Gemini API GenerationConfig (ai.google.dev/api/generate-content#generationconfig): temperature 0-2, at "
            "most 5 stopSequences, seed int32")
_GEM_THINKING = ("Gemini thinking guide (ai.google.dev/gemini-api/docs/thinking): thinkingBudget 128-32768 on 2.5 "
                 "Pro, which cannot turn thinking off; 0-24576 on 2.5 Flash, 0 turning it off; 512-24576 on 2.5 "
                 "Flash-Lite, off by default; thinkingLevel low and high on Gemini 3 Pro, low, medium and high on "
                 "3.1 Pro, minimal, low, medium and high on 3 Flash")
_GEM_PENALTY = ("Gemini 2.5 answers 400 'Penalty is not enabled for models/gemini-2.5-flash' to presencePenalty and "
                "frequencyPenalty (vercel/ai#8943, google-gemini/cookbook#1290); Gemini 2.0 and 1.5 take them")

# -- Bedrock Converse ------------------------------------------------------------------------------------------
_BR_SCHEMA = ("Amazon Bedrock user guide, structured outputs (docs.aws.amazon.com/bedrock/latest/userguide/"
              "structured-output.html#structured-output-supported-models): outputConfig.textFormat on Claude Sonnet "
              "4.5, Haiku 4.5, Opus 4.5 and Opus 4.6 (claude-messages-structured-outputs.html), Qwen3, gpt-oss, "
              "DeepSeek V3.x, Gemma 3 12B and 27B, Kimi K2, NVIDIA Nemotron, Mistral's (the list as "
              "langchain-aws#883 and 567-labs/instructor#2084 quote it, and models.dev's amazon-bedrock entries set "
              "from it, anomalyco/models.dev#1326); no other model")

RULES: tuple[ModelRule, ...] = (
    # -- OpenAI -------------------------------------------------------------------------------------------------
    ModelRule("openai", r"o1-(?:mini|preview)", "o1-mini", f"{_OAI_REASONING}; {_OAI_O1_MINI}",
              {**_REASONS, "max_stop": 0, "reasoning": "always", "efforts": (), "schema": False,
               "json_mode": False}),
    ModelRule("openai", r"o\d", "o-series", f"{_OAI_REASONING}; {_OAI_FORMATS}",
              {**_REASONS, "max_stop": 0, "reasoning": "always", "efforts": ("low", "medium", "high"),
               "schema": True, "json_mode": True}),
    ModelRule("openai", r"gpt-5(?:\.\d+)?-chat", "gpt-5-chat", _OAI_FORMATS, {"schema": True, "json_mode": True}),
    ModelRule("openai", r"gpt-5-pro" + _DATED, "gpt-5-pro", f"{_OAI_REASONING}; {_OAI_EFFORTS}",
              {**_REASONS, "max_stop": 0, "reasoning": "always", "efforts": ("high",)}),
    ModelRule("openai", r"gpt-5(?:-mini|-nano)?" + _DATED, "gpt-5", f"{_OAI_REASONING}; {_OAI_EFFORTS}",
              {**_REASONS, "max_stop": 0, "reasoning": "always", "efforts": ("minimal", "low", "medium", "high"),
               "schema": True, "json_mode": True}),
    ModelRule("openai", r"gpt-5\.1" + _DATED, "gpt-5.1", f"{_OAI_REASONING}; {_OAI_EFFORTS}",
              {**_REASONS, "max_stop": 0, "reasoning": "default", "efforts": ("none", "low", "medium", "high"),
               "schema": True, "json_mode": True}),
    ModelRule("openai", r"gpt-5\.[2-4]" + _DATED, "gpt-5.2-5.4", f"{_OAI_REASONING}; {_OAI_EFFORTS}",
              {**_REASONS, "max_stop": 0, "reasoning": "default",
               "efforts": ("none", "low", "medium", "high", "xhigh"), "schema": True, "json_mode": True}),
    ModelRule("openai", r"gpt-5\.(?:[5-9]|\d\d)" + _DATED, "gpt-5.5+", _OAI_REASONING,
              {**_REASONS, "max_stop": 4, "reasoning": "default"}),
    ModelRule("openai", r"gpt-5\.[1-4]-", "gpt-5.1-5.4 variants", _OAI_REASONING,
              {**_REASONS, "max_stop": 0, "reasoning": "default"}),
    ModelRule("openai", r"gpt-4(?:-0613|-0314)?$|gpt-3\.5-turbo-(?:0613|0301|16k)", "gpt-4 (no response format)",
              f"{_OAI_FORMATS}; {_OAI_DOC}",
              {**_SAMPLES, "reasoning": "never", "logprobs": True, "schema": False, "json_mode": False}),
    ModelRule("openai", r"gpt-4-turbo|gpt-4-\d{4}-preview|gpt-3\.5-turbo|gpt-4o-2024-05-13", "gpt-4 turbo",
              f"{_OAI_FORMATS}; {_OAI_DOC}",
              {**_SAMPLES, "reasoning": "never", "logprobs": True, "schema": False, "json_mode": True}),
    ModelRule("openai", r"gpt-4o|gpt-4\.1", "gpt-4o", f"{_OAI_FORMATS}; {_OAI_DOC}",
              {**_SAMPLES, "reasoning": "never", "logprobs": True, "schema": True, "json_mode": True}),
    # -- Anthropic ----------------------------------------------------------------------------------------------
    ModelRule("anthropic", r"claude-(?:fable|mythos)", "claude-fable", f"{_ANT_47}; {_ANT_ADAPTIVE}",
              {"temperature": None, "top_p": False, "reasoning": "always", "budget": None, "schema": True,
               "efforts": ("low", "medium", "high", "xhigh", "max"), "thinking_omitted": True}),
    ModelRule("anthropic", r"claude-(?:opus-4-[7-9]|opus-[5-9]|sonnet-[5-9]|haiku-[5-9])", "claude-4.7+",
              f"{_ANT_47}; {_ANT_ADAPTIVE}",
              {"temperature": None, "top_p": False, "budget": None, "schema": True,
               "efforts": ("low", "medium", "high", "xhigh", "max"), "thinking_omitted": True}),
    ModelRule("anthropic", r"claude-(?:opus|sonnet)-4-6", "claude-4.6", f"{_ANT_ADAPTIVE}; {_ANT_EFFORT}; "
              f"{_ANT_THINKING}; {_ANT_SCHEMA}",
              {"reasoning": "optional", "efforts": ("low", "medium", "high", "max"), "budget": (1024, None),
               "schema": True}),
    ModelRule("anthropic", r"claude-(?:sonnet|haiku)-4-5", "claude-4.5", f"{_ANT_TOP_P}; {_ANT_THINKING}; "
              f"{_ANT_SCHEMA}",
              {"temperature": (0.0, 1.0), "temperature_with_top_p": False, "reasoning": "optional", "efforts": (),
               "budget": (1024, None), "schema": True}),
    ModelRule("anthropic", r"claude-opus-4-[15]", "claude-opus-4.1-4.5", f"{_ANT_THINKING}; {_ANT_SCHEMA}",
              {"temperature": (0.0, 1.0), "reasoning": "optional", "efforts": (), "budget": (1024, None),
               "schema": True}),
    ModelRule("anthropic", r"claude-(?:opus-4|sonnet-4|3-7-sonnet)", "claude-3.7-4.0", f"{_ANT_THINKING}; "
              f"{_ANT_SCHEMA}",
              {"temperature": (0.0, 1.0), "temperature_with_top_p": True, "reasoning": "optional", "efforts": (),
               "budget": (1024, None), "schema": False}),
    ModelRule("anthropic", r"claude-3-(?:5-)?(?:haiku|sonnet|opus)", "claude-3", f"{_ANT_REF}; {_ANT_SCHEMA}",
              {"temperature": (0.0, 1.0), "temperature_with_top_p": True, "reasoning": "never", "efforts": (),
               "budget": None, "schema": False}),
    # -- Gemini -------------------------------------------------------------------------------------------------
    ModelRule("gemini", r"gemini-3-pro(?:-preview)?(?:-\d\d-\d\d\d\d)?$", "gemini-3-pro",
              f"{_GEM_THINKING}; {_GEM_PENALTY}", {"reasoning": "always", "efforts": ("low", "high")}),
    ModelRule("gemini", r"gemini-3\.1-pro(?:-preview)?(?:-\d\d-\d\d\d\d)?$", "gemini-3.1-pro", _GEM_THINKING,
              {"reasoning": "always", "efforts": ("low", "medium", "high")}),
    ModelRule("gemini", r"gemini-3-flash(?:-preview)?(?:-\d\d-\d\d\d\d)?$", "gemini-3-flash", _GEM_THINKING,
              {"reasoning": "always", "efforts": ("minimal", "low", "medium", "high")}),
    ModelRule("gemini", r"gemini-2\.5-pro(?:-preview-\d\d-\d\d|-\d{3})?$", "gemini-2.5-pro",
              f"{_GEM_THINKING}; {_GEM_PENALTY}",
              {"penalties": False, "reasoning": "always", "efforts": (), "budget": (128, 32768),
               "budget_zero_off": False}),
    ModelRule("gemini", r"gemini-2\.5-flash-lite(?:-preview-\d\d-\d\d\d\d|-\d{3})?$", "gemini-2.5-flash-lite",
              f"{_GEM_THINKING}; {_GEM_PENALTY}",
              {"penalties": False, "reasoning": "optional", "efforts": (), "budget": (512, 24576),
               "budget_zero_off": True}),
    ModelRule("gemini", r"gemini-2\.5-flash(?:-preview-\d\d-\d\d(?:\d\d)?|-\d{3})?$", "gemini-2.5-flash",
              f"{_GEM_THINKING}; {_GEM_PENALTY}",
              {"penalties": False, "reasoning": "default", "efforts": (), "budget": (1, 24576),
               "budget_zero_off": True}),
    ModelRule("gemini", r"gemini-(?:2\.0|1\.5)-(?:flash|pro)", "gemini-2.0", f"{_GEM_THINKING}; {_GEM_PENALTY}",
              {"penalties": True, "reasoning": "never", "efforts": (), "budget": None}),
    # -- Bedrock Converse (the model id without its geography prefix) --------------------------------------------
    ModelRule("converse", r"anthropic\.claude-(?:sonnet-4-5|haiku-4-5|opus-4-5|opus-4-6)", "claude", _BR_SCHEMA,
              {"schema": True}),
    ModelRule("converse", r"qwen\.qwen3|openai\.gpt-oss|deepseek\.v3|google\.gemma-3-(?:12b|27b)|"
              r"moonshot(?:ai)?\.kimi-k2|nvidia\.nemotron|mistral\.(?:devstral|magistral|ministral|"
              r"mistral-large-3|voxtral)", "open weights", _BR_SCHEMA, {"schema": True}),
)

#: what every model of an API takes, whatever its family (a family's rule states more, or otherwise)
API_WIDE: dict[str, tuple[Mapping[str, Any], str]] = {
    "openai": ({"max_stop": 4, "seed": _INT64}, _OAI_DOC),
    "anthropic": ({"temperature": (0.0, 1.0), "top_p": True, "penalties": False, "max_stop": None, "seed": None,
                   "logprobs": False, "json_mode": False}, _ANT_REF),
    "gemini": ({"temperature": (0.0, 2.0), "top_p": True, "max_stop": 5, "seed": _INT32}, _GEM_DOC),
    # structured outputs only on the models the page lists
    "converse": ({"schema": False}, _BR_SCHEMA),
}

_OAI_PAGES = "OpenAI model pages (platform.openai.com/docs/models): max output tokens"
_ANT_PAGES = "Anthropic models overview (platform.claude.com/docs/en/about-claude/models/overview): max output"
#: the most output tokens a model writes, from its page: (api, pattern, limit, source), first match
OUTPUT_LIMITS: tuple[tuple[str, str, int, str], ...] = (
    ("openai", r"o1-mini" + _DATED, 65536, _OAI_PAGES),
    ("openai", r"o1-preview" + _DATED, 32768, _OAI_PAGES),
    ("openai", r"o1|o3|o3-mini|o4-mini", 100000, _OAI_PAGES),
    ("openai", r"gpt-5-pro" + _DATED, 272000, _OAI_PAGES),
    ("openai", r"gpt-5(?:-mini|-nano)?" + _DATED, 128000, _OAI_PAGES),
    ("openai", r"gpt-5\.[1-4]" + _DATED, 128000, _OAI_PAGES),
    ("openai", r"gpt-4\.1(?:-mini|-nano)?" + _DATED, 32768, _OAI_PAGES),
    ("openai", r"gpt-4o-2024-05-13$", 4096, _OAI_PAGES),
    ("openai", r"gpt-4o(?:-mini)?" + _DATED, 16384, _OAI_PAGES),
    ("openai", r"gpt-4-turbo" + _DATED, 4096, _OAI_PAGES),
    ("openai", r"gpt-4(?:-0613)?$", 8192, _OAI_PAGES),
    ("openai", r"gpt-3\.5-turbo(?:-0125)?$", 4096, _OAI_PAGES),
    ("anthropic", r"claude-3-(?:haiku|opus|sonnet)-", 4096, _ANT_PAGES),
    ("anthropic", r"claude-3-5-(?:haiku|sonnet)-", 8192, _ANT_PAGES),
    ("anthropic", r"claude-(?:3-7-sonnet|sonnet-4|sonnet-4-5|haiku-4-5|opus-4-5|sonnet-4-6)(?:-\d{8}|-0|-latest)?$",
     64000, _ANT_PAGES),
    ("anthropic", r"claude-opus-4(?:-1)?(?:-\d{8}|-0)?$", 32000, _ANT_PAGES),
    ("anthropic", r"claude-opus-4-[67](?:-\d{8})?$", 128000, _ANT_PAGES),
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the server's rules say of one model: the API's facts with its family's over them."""

    api: str
    model: str
    values: Mapping[str, Any]
    #: the family of the rule that named the model, None when only the API's facts apply
    family: str | None = None
    sources: tuple[str, ...] = field(default=())

    @property
    def known(self) -> bool:
        """Whether a rule of a family names the model (not only its API's facts)."""
        return self.family is not None

    def says(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


#: what each platform serves of a model's own facts (platform, api, pattern, facts, source), where it serves less
PLATFORMS: tuple[tuple[str, str, str, Mapping[str, Any], str], ...] = (
    ("vertex", "anthropic", r"claude-(?:opus-4-[15]|sonnet-4-5|haiku-4-5)", {"schema": False},
     "Google Cloud, Structured outputs with Anthropic Claude models (docs.cloud.google.com/vertex-ai/generative-ai/"
     "docs/partner-models/claude/structured_outputs): Claude Opus 4.7, Sonnet 4.6 and Opus 4.6; Opus 4.5, "
     "Sonnet 4.5 and Haiku 4.5 'coming soon'"),
    ("bedrock", "anthropic", r"claude-opus-4-1", {"schema": False},
     "Amazon Bedrock user guide, Claude structured outputs (docs.aws.amazon.com/bedrock/latest/userguide/"
     "claude-messages-structured-outputs.html): Claude Sonnet 4.5, Haiku 4.5, Opus 4.5 and Opus 4.6"),
)


@functools.cache
def facts(api: str, model: str, platform: str | None = None) -> Facts:
    """What the rules say of ``model`` on ``api`` (served by ``platform``: vertex, bedrock, or the API's own)."""
    name = model.replace("@", "-") if api == "anthropic" else model
    if api == "converse":
        name = re.sub(r"^(?:us|eu|apac|jp|au|ca|us-gov|global)\.(?=[a-z0-9-]+\.)", "", name)
    base, base_source = API_WIDE.get(api, ({}, ""))
    values = dict(base)
    sources = [base_source] if base_source else []
    rule = next((r for r in RULES if r.api == api and re.match(r.pattern, name)), None)
    if rule is not None:
        values.update(rule.facts)
        sources.append(rule.source)
    limit = next(((lim, src) for a, pattern, lim, src in OUTPUT_LIMITS if a == api and re.match(pattern, name)), None)
    if limit is not None:
        values["max_output"] = limit[0]
        sources.append(limit[1])
    for where, rule_api, pattern, served, source in PLATFORMS:
        if where == platform and rule_api == api and re.match(pattern, name):
            values.update(served)
            sources.append(source)
    return Facts(api, model, values, rule.family if rule is not None else None, tuple(sources))
