"""The capability table's data: one :class:`Rule` per model family and API, each with the document it comes from,
tried in order (the first whose pattern matches the model id applies), and the API versions and thinking allowances
the runner sends. runner/providers/capabilities.py reads it, with what the models.dev catalogue says folded in, and
shapes each stage's parameters by it; ``TABLE_VERSION`` is the date the table was last checked against its
sources. Data only: nothing here is looked up or imported from the rest of the runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TABLE_VERSION = "2026-11-30"

#: the Anthropic API versions the runner knows, and the one it sends unless ``providers: {anthropic:
#: {api_version: ...}}`` says otherwise. 2026-10-21 (the default of anthropic SDK 2.x) refuses temperature, top_p
#: and top_k for every model, even at their default values (Anthropic's versioning page and the 2026-10-21 migration
#: guide, platform.claude.com/docs/en/api/versioning); 2023-06-01 still takes them for the models that do, which a
#: temperature-0 evaluation needs. Pinned so that an SDK upgrade cannot change what is sent.
ANTHROPIC_VERSIONS = ("2023-06-01", "2026-10-21")
ANTHROPIC_DEFAULT_VERSION = "2023-06-01"
#: Gemini's API version: v1beta serves systemInstruction, responseMimeType, responseJsonSchema, thinkingConfig and
#: batch mode; v1 (google-genai 3.x's default) has none of the first four (generativelanguage v1 and v1beta
#: protos, googleapis/googleapis google/ai/generativelanguage/{v1,v1beta}/generative_service.proto)
GEMINI_API_VERSION = "v1beta"
#: the first dated Azure OpenAI API version that serves the reasoning models (o-series, gpt-5) and their
#: reasoning_effort; the GA version 2024-10-21 has neither (Microsoft Learn, "Azure OpenAI reasoning models", API
#: support: learn.microsoft.com/azure/ai-foundry/openai/how-to/reasoning; the 2024-10-21 and 2024-12-01-preview
#: inference specifications in Azure's azure-rest-api-specs)
AZURE_REASONING_VERSION = "2024-12-01-preview"
#: the answer's room on Anthropic when a job sets no max_tokens (the Messages API requires one); as
#: anthropic_messages.DEFAULT_MAX_TOKENS
ANTHROPIC_REQUIRED_CAP = 1024

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
#: output tokens the runner adds to the cap for thinking when a job names an effort but no budget (the thinking
#: allowance): the job's ``max_tokens`` is the answer's room, thinking gets its own on top. OpenAI's reasoning
#: guide suggests reserving about 25,000 tokens for reasoning and answer when starting out; these are the runner's
#: defaults per level, overridden by ``reasoning: {budget_tokens: N}``.
EFFORT_ALLOWANCE = {"none": 0, "minimal": 1024, "low": 4096, "medium": 16384, "high": 32768, "xhigh": 65536,
                    "max": 65536}
#: the effort an always-reasoning model uses when the job sets none (OpenAI's default is medium)
DEFAULT_EFFORT = "medium"
#: a thinking budget for an effort, for APIs that take only a budget (Gemini 2.5, Claude's budget form)
EFFORT_BUDGET = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576, "xhigh": 32768, "max": 32768}


@dataclass(frozen=True, slots=True)
class Rule:
    """What one model family's API takes. ``None`` for a range means the parameter is refused."""

    provider: str
    #: a regular expression matched (``re.match``) against the model id
    pattern: str
    family: str
    source: str
    temperature: tuple[float, float] | None = (0.0, 2.0)
    top_p: bool = True
    #: False: temperature and top_p may not both be set
    temperature_with_top_p: bool = True
    #: presence_penalty and frequency_penalty (-2 to 2, the job's range): False when the API refuses them
    penalties: bool = True
    #: the most stop sequences a request may carry; 0: none at all
    max_stop: int | None = None
    #: the seed's range; None: the API has no seed (it is not sent, and a job's seed is refused)
    seed: tuple[int, int] | None = None
    logprobs: bool = False
    #: "never": no thinking; "optional": off unless asked; "default": on unless turned off; "always": cannot be off
    reasoning: Literal["never", "optional", "default", "always"] = "never"
    #: the effort levels the API takes, () when it takes none
    efforts: tuple[str, ...] = ()
    #: the range a thinking budget may take, None when the API takes no budget
    budget: tuple[int, int] | None = None
    #: whether a budget of 0 turns thinking off (Gemini 2.5 Flash)
    budget_zero_off: bool = False
    #: whether thinking counts against the output cap (all three APIs: max_completion_tokens, max_tokens,
    #: maxOutputTokens), so the runner widens the cap by the thinking allowance
    thinking_in_cap: bool = True
    #: structured outputs with a JSON Schema
    schema: bool = False
    #: JSON mode without a schema (OpenAI json_object, Gemini responseMimeType)
    json_mode: bool = False
    #: sampling parameters refused while thinking is on (Claude's budget form: temperature and top_k)
    no_sampling_when_thinking: bool = False
    #: the output token limit when models.dev does not say
    max_output: int | None = None


_OPENAI_DOC = "OpenAI OpenAPI document, CreateChatCompletionRequest (extract kept in simserver/published/)"
_OPENAI_REASONING = ("OpenAI reasoning guide (platform.openai.com/docs/guides/reasoning): reasoning models take "
                     "reasoning_effort, count reasoning tokens in max_completion_tokens, and refuse temperature "
                     "other than 1, top_p, logprobs and (but gpt-5.5 and later) stop: 400 unsupported_parameter")
_ANTHROPIC_SAMPLING = ("Anthropic models overview and migration notes: Claude Opus 4.7 and later, Sonnet 5 and later, "
                       "Haiku 5.5, Fable and Mythos refuse temperature, top_p and top_k on every API version; adaptive "
                       "thinking only, depth by output_config.effort")
_ANTHROPIC_4X = ("Anthropic models overview: Opus 4.1 and later, Sonnet 4.5 and later, Haiku 4.5 refuse temperature "
                 "and top_p together ('temperature and top_p cannot both be specified for this model')")
_ANTHROPIC_THINKING = ("Anthropic extended thinking (platform.claude.com/docs/en/build-with-claude/extended-thinking):"
                       " thinking {type: enabled, budget_tokens >= 1024 and < max_tokens}; not compatible with "
                       "temperature or top_k")
_ANTHROPIC_STRUCTURED = ("Anthropic structured outputs (platform.claude.com/docs/en/build-with-claude/"
                         "structured-outputs): output_config.format json_schema on Sonnet 4.5, Opus 4.1, Haiku 4.5 "
                         "and later")
_GEMINI_DOC = ("Gemini API GenerationConfig (ai.google.dev/api/generate-content#generationconfig): at most 5 "
               "stopSequences, seed int32, temperature 0-2")
_OPENAI_EFFORTS = ("openai/openai-ruby lib/openai/models/reasoning_effort.rb at cdafc127 (the OpenAPI description): "
                   "gpt-5.1 takes none, low, medium and high; models before it no none; gpt-5-pro only high; xhigh "
                   "the models after gpt-5.1-codex-max")
_OPENAI_O1_MINI = ("OpenAI API reference, reasoning_effort: o1 and o3-mini on (dzhng/deep-research#89; o1-mini answers "
                   "'Unknown parameter: reasoning_effort', BerriAI/litellm#11819); the o1-preview and o1-mini beta "
                   "limits: no response_format")
_OPENAI_FORMATS = ("OpenAI API reference, response_format: 'Compatible with GPT-4o, GPT-4o mini, GPT-4 Turbo and all "
                   "GPT-3.5 Turbo models newer than gpt-3.5-turbo-1106'; json_schema from gpt-4o-2024-08-06 on")
_OPENAI_PENALTIES = ("OpenAI reasoning guide: reasoning models refuse presence_penalty and frequency_penalty, as they "
                     "refuse temperature")
_ANTHROPIC_PENALTIES = ("Anthropic Messages API reference (and the anthropic SDK's MessageCreateParams): no "
                        "presence or frequency penalty field")
_GEMINI_PENALTIES = ("Gemini 2.5 and later answer 400 'Penalty is not enabled for models/gemini-2.5-flash' to "
                     "presencePenalty/frequencyPenalty (PublicAffairs/openai-gemini#63, BerriAI/litellm#32273); "
                     "Gemini 2.0 and 1.5 take them")
_GEMINI_THINKING = ("Gemini thinking guide (ai.google.dev/gemini-api/docs/thinking): thinkingBudget 128-32768 on 2.5 "
                    "Pro (cannot be turned off), 0-24576 on 2.5 Flash (0 turns it off), 512-24576 on 2.5 Flash-Lite "
                    "(off by default); Gemini 3 takes thinkingLevel and cannot be turned off: low and high on 3 Pro, "
                    "low, medium and high on 3.1 Pro, minimal to high on 3 Flash")

_CONVERSE = ("botocore's bedrock-runtime service model (botocore/data/bedrock-runtime/2023-09-30/service-2.json), "
             "InferenceConfiguration: maxTokens >= 1, temperature 0-1, topP 0-1, stopSequences; OutputConfig: "
             "textFormat (json_schema only) and effort; no seed, penalties, logprobs or thinking budget through "
             "Converse. No AWS page names a model other than Claude (sent through InvokeModel here) that reads "
             "outputConfig.effort, whose documented values are Claude's: no Converse rule takes an effort")
_BEDROCK_SCHEMA = ("Amazon Bedrock user guide, structured outputs (docs.aws.amazon.com/bedrock/latest/userguide/"
                   "structured-output.html#structured-output-supported-models): outputConfig.textFormat only on the "
                   "models listed: Qwen3, gpt-oss, DeepSeek V3.x, Gemma 3 12B and 27B, Kimi K2, NVIDIA Nemotron and "
                   "Mistral's (the list as langchain-aws#883 and 567-labs/instructor#2084 quote it; models.dev's "
                   "amazon-bedrock entries, set from it in anomalyco/models.dev#1326, fold in over it)")
#: the geography prefix of a cross-region inference profile (runner/providers/bedrock_ids.py)
_BEDROCK_PROFILE = r"(?:(?:us|eu|apac|jp|au|ca|us-gov|global)\.)?"

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

RULES: tuple[Rule, ...] = (
    # -- OpenAI ---------------------------------------------------------------------------------------------
    Rule("openai", r"gpt-5\.(?:[5-9]|\d\d)", "gpt-5.5+", f"{_OPENAI_REASONING}; {_OPENAI_PENALTIES}; {_OPENAI_DOC}",
         temperature=None, top_p=False, penalties=False, max_stop=4, seed=INT64, reasoning="default",
         efforts=("none", "low", "medium", "high", "xhigh"), schema=True, json_mode=True, max_output=128000),
    Rule("openai", r"gpt-5(?:\.\d+)?-chat", "gpt-5-chat", f"models.dev; {_OPENAI_DOC}", max_stop=4, seed=INT64,
         schema=True, json_mode=True, max_output=16384),
    Rule("openai", r"gpt-5\.1(?:-\d{4}-\d\d-\d\d)?$", "gpt-5.1",
         f"{_OPENAI_REASONING}; {_OPENAI_EFFORTS}; {_OPENAI_PENALTIES}; {_OPENAI_DOC}", temperature=None, top_p=False,
         penalties=False, max_stop=0, seed=INT64, reasoning="default", efforts=("none", "low", "medium", "high"),
         schema=True, json_mode=True, max_output=128000),
    Rule("openai", r"gpt-5\.[1-4]", "gpt-5.1-5.4", f"{_OPENAI_REASONING}; {_OPENAI_PENALTIES}; {_OPENAI_DOC}",
         temperature=None, top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="default",
         efforts=("none", "low", "medium", "high", "xhigh"), schema=True, json_mode=True, max_output=128000),
    Rule("openai", r"gpt-5-pro", "gpt-5-pro", f"{_OPENAI_REASONING}; {_OPENAI_EFFORTS}; {_OPENAI_PENALTIES}; "
         f"{_OPENAI_DOC}", temperature=None, top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="always",
         efforts=("high",), schema=True, json_mode=True, max_output=272000),
    Rule("openai", r"gpt-5", "gpt-5", f"{_OPENAI_REASONING}; {_OPENAI_PENALTIES}; {_OPENAI_DOC}", temperature=None,
         top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="always",
         efforts=("minimal", "low", "medium", "high"), schema=True, json_mode=True, max_output=128000),
    Rule("openai", r"o1-mini", "o1-mini", f"{_OPENAI_REASONING}; {_OPENAI_O1_MINI}; {_OPENAI_DOC}",
         temperature=None, top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="always",
         max_output=65536),
    Rule("openai", r"o1-preview", "o1-preview", f"{_OPENAI_REASONING}; {_OPENAI_O1_MINI}; {_OPENAI_DOC}",
         temperature=None, top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="always",
         max_output=32768),
    Rule("openai", r"o\d", "o-series", f"{_OPENAI_REASONING}; {_OPENAI_PENALTIES}; {_OPENAI_DOC}", temperature=None,
         top_p=False, penalties=False, max_stop=0, seed=INT64, reasoning="always", efforts=("low", "medium", "high"),
         schema=True, json_mode=True, max_output=100000),
    Rule("openai", r"gpt-4(?:-0613|-0314)?$", "gpt-4 (no response format)", f"{_OPENAI_FORMATS}; {_OPENAI_DOC}",
         max_stop=4, seed=INT64, logprobs=True, max_output=8192),
    Rule("openai", r"gpt-3\.5-turbo-(?:0613|0301|16k)", "gpt-3.5 (no response format)",
         f"{_OPENAI_FORMATS}; {_OPENAI_DOC}", max_stop=4, seed=INT64, logprobs=True, max_output=4096),
    Rule("openai", r"gpt-4o-2024-05-13|gpt-4-|gpt-3\.5", "gpt-4 (no schema)", f"{_OPENAI_FORMATS}; {_OPENAI_DOC}",
         max_stop=4, seed=INT64, logprobs=True, json_mode=True, max_output=4096),
    Rule("openai", r"", "chat", _OPENAI_DOC, max_stop=4, seed=INT64, logprobs=True, schema=True, json_mode=True,
         max_output=16384),
    # -- Anthropic: no penalties on any model ----------------------------------------------------------------
    Rule("anthropic", r"claude-(?:fable|mythos)", "claude-fable", f"{_ANTHROPIC_SAMPLING}; {_ANTHROPIC_PENALTIES}",
         temperature=None, top_p=False, penalties=False, reasoning="always",
         efforts=("low", "medium", "high", "xhigh", "max"), schema=True, max_output=128000),
    Rule("anthropic", r"claude-(?:opus-4-[7-9]|opus-[5-9]|sonnet-[5-9]|haiku-[5-9])", "claude-4.7+",
         f"{_ANTHROPIC_SAMPLING}; {_ANTHROPIC_PENALTIES}", temperature=None, top_p=False, penalties=False,
         reasoning="optional", efforts=("low", "medium", "high", "xhigh", "max"), schema=True, max_output=128000),
    Rule("anthropic", r"claude-(?:opus|sonnet)-4-6", "claude-4.6",
         f"{_ANTHROPIC_4X}; {_ANTHROPIC_THINKING}; {_ANTHROPIC_PENALTIES}", temperature=(0.0, 1.0),
         temperature_with_top_p=False, penalties=False, reasoning="optional",
         efforts=("low", "medium", "high", "max"), budget=(1024, 128000), schema=True,
         no_sampling_when_thinking=True, max_output=128000),
    Rule("anthropic", r"claude-(?:opus-4-[15]|sonnet-4-5|haiku-4-5)", "claude-4.1-4.5",
         f"{_ANTHROPIC_4X}; {_ANTHROPIC_THINKING}; {_ANTHROPIC_STRUCTURED}; {_ANTHROPIC_PENALTIES}",
         temperature=(0.0, 1.0), temperature_with_top_p=False, penalties=False, reasoning="optional",
         budget=(1024, 64000), schema=True, no_sampling_when_thinking=True, max_output=64000),
    Rule("anthropic", r"claude-(?:opus-4|sonnet-4|3-7-sonnet)", "claude-3.7-4.0",
         f"{_ANTHROPIC_THINKING}; {_ANTHROPIC_PENALTIES}", temperature=(0.0, 1.0), penalties=False,
         reasoning="optional", budget=(1024, 64000), no_sampling_when_thinking=True, max_output=64000),
    Rule("anthropic", r"", "claude-3", f"Anthropic Messages API reference: temperature 0-1; {_ANTHROPIC_PENALTIES}",
         temperature=(0.0, 1.0), penalties=False, max_output=8192),
    # -- Gemini ---------------------------------------------------------------------------------------------
    Rule("gemini", r"gemini-3-pro(?:-preview)?(?:-\d\d-\d\d\d\d)?$", "gemini-3-pro",
         f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}", penalties=False, max_stop=5, seed=INT32,
         reasoning="always", efforts=("low", "high"), budget=(128, 32768), schema=True, json_mode=True,
         max_output=65536),
    Rule("gemini", r"gemini-3\.1-pro(?:-preview)?(?:-\d\d-\d\d\d\d)?$", "gemini-3.1-pro",
         f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}", penalties=False, max_stop=5, seed=INT32,
         reasoning="always", efforts=("low", "medium", "high"), budget=(128, 32768), schema=True, json_mode=True,
         max_output=65536),
    Rule("gemini", r"gemini-[3-9]", "gemini-3", f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}",
         penalties=False, max_stop=5, seed=INT32, reasoning="always", efforts=("minimal", "low", "medium", "high"),
         budget=(128, 32768), schema=True, json_mode=True, max_output=65536),
    Rule("gemini", r"gemini-2\.5-pro", "gemini-2.5-pro", f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}",
         penalties=False, max_stop=5, seed=INT32, reasoning="always", budget=(128, 32768), schema=True,
         json_mode=True, max_output=65536),
    Rule("gemini", r"gemini-2\.5-flash-lite", "gemini-2.5-flash-lite",
         f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}", penalties=False, max_stop=5, seed=INT32,
         reasoning="optional", budget=(512, 24576), budget_zero_off=True, schema=True, json_mode=True,
         max_output=65536),
    Rule("gemini", r"gemini-2\.5|gemini-(?:flash|pro)", "gemini-2.5-flash",
         f"{_GEMINI_THINKING}; {_GEMINI_PENALTIES}; {_GEMINI_DOC}", penalties=False, max_stop=5, seed=INT32,
         reasoning="default", budget=(1, 24576), budget_zero_off=True, schema=True, json_mode=True,
         max_output=65536),
    Rule("gemini", r"", "gemini", f"{_GEMINI_DOC}; {_GEMINI_PENALTIES}", max_stop=5, seed=INT32, logprobs=True,
         schema=True, json_mode=True, max_output=8192),
    # -- AWS Bedrock's Converse API (Claude on Bedrock is looked up as anthropic, by its Claude name) -----------
    Rule("bedrock", _BEDROCK_PROFILE + r"(?:qwen\.qwen3|openai\.gpt-oss|deepseek\.v3|google\.gemma-3-(?:12b|27b)|"
         r"moonshot(?:ai)?\.kimi-k2|nvidia\.nemotron|mistral\.(?:devstral|magistral|ministral|mistral-large-3|"
         r"voxtral))", "converse (structured outputs)", f"{_CONVERSE}; {_BEDROCK_SCHEMA}", temperature=(0.0, 1.0),
         penalties=False, schema=True),
    Rule("bedrock", r"", "converse", f"{_CONVERSE}; {_BEDROCK_SCHEMA}", temperature=(0.0, 1.0), penalties=False),
    # -- the embedded model -----------------------------------------------------------------------------------
    Rule("local", r"", "embedded", "runner/providers/local.py: llama-cpp-python's create_chat_completion with "
         "temperature, max_tokens, top_p, presence_penalty, frequency_penalty, stop and a uint32 seed; no "
         "thinking, no response format", seed=(0, 2**32 - 1)),
)


# -- platforms serving another's models --------------------------------------------------------------------
# A cloud serving a model family through its own platform (Claude on Vertex AI, Claude on Bedrock) may serve less of
# it than the family's own API: a ``PlatformRule`` takes that away from the family's rule for the models it names,
# and says in its own words what to do instead.


@dataclass(frozen=True, slots=True)
class PlatformRule:
    """What one platform does not serve of one model family's capabilities, with the document saying so."""

    provider: str  #: the platform's provider (vertex, bedrock)
    table: str  #: the rules the models are read under there (anthropic)
    #: matched (``re.match``) against the name the table reads the model under (``claude-sonnet-4-5-20250929``)
    pattern: str
    source: str
    #: False: no structured outputs with a JSON Schema there
    schema: bool | None = None
    #: the refusal's words: why (after the model's name) and what to do
    why: str = ""
    fix: str = ""


_VERTEX_CLAUDE_SCHEMA = ("Google Cloud, Structured outputs with Anthropic Claude models (docs.cloud.google.com/"
                         "vertex-ai/generative-ai/docs/partner-models/claude/structured_outputs): Vertex AI serves "
                         "them for Claude Opus 4.7, Sonnet 4.6 and Opus 4.6; Opus 4.5, Sonnet 4.5 and Haiku 4.5 "
                         "'coming soon'; off until the organization policy constraints/vertexai."
                         "allowedPartnerModelFeatures allows structured_outputs")
_BEDROCK_CLAUDE_SCHEMA = ("Amazon Bedrock user guide, Claude structured outputs (docs.aws.amazon.com/bedrock/latest/"
                          "userguide/claude-messages-structured-outputs.html): Claude Sonnet 4.5, Haiku 4.5, Opus 4.5 "
                          "and Opus 4.6 on the bedrock-runtime endpoint")

PLATFORM_RULES: tuple[PlatformRule, ...] = (
    PlatformRule("vertex", "anthropic", r"claude-(?:opus-4-[15]|sonnet-4-5|haiku-4-5)", _VERTEX_CLAUDE_SCHEMA,
                 schema=False, why="has no structured outputs on Vertex AI (Google Cloud offers them for Claude "
                 "Opus 4.7, Sonnet 4.6 and Opus 4.6; for Opus 4.5, Sonnet 4.5 and Haiku 4.5 they are 'coming soon')",
                 fix="use vertex:claude-sonnet-4-6 or a later Claude model, or the same model on anthropic:, or "
                 "remove the stage's schema:"),
    PlatformRule("bedrock", "anthropic", r"claude-opus-4-1", _BEDROCK_CLAUDE_SCHEMA, schema=False,
                 why="has no structured outputs on Bedrock (AWS offers them for Claude Sonnet 4.5, Haiku 4.5, Opus "
                 "4.5 and Opus 4.6)", fix="use one of those models, or remove the stage's schema:"),
)


# -- service tiers ------------------------------------------------------------------------------------------
# The same model sold at several service tiers: standard (what every request gets without asking), flex (cheaper,
# slower, may be shed) and priority (dearer, faster). ``TIER_RULES`` say which of flex and priority a model takes
# beyond standard, tried in order per provider as ``RULES`` are; runner/providers/tiers.py reads them, and
# ``runner validate`` refuses a tier a model does not take (runner/spec/tiers.py).


@dataclass(frozen=True, slots=True)
class TierRule:
    """The tiers beyond standard that one model family takes at one provider, with the document saying so."""

    provider: str
    #: a regular expression matched (``re.match``) against the model id; "" matches every model (the provider's
    #: last rule: the models its documents do not name take no tier)
    pattern: str
    tiers: tuple[str, ...]
    source: str


_OPENAI_TIERS = ("OpenAI pricing page (platform.openai.com/docs/pricing: a model's Flex and Priority prices, as "
                 "genai-prices 0.2.3 carries them); flex guide (platform.openai.com/docs/guides/flex-processing: "
                 "'supported models are listed on the pricing page'); priority guide "
                 "(platform.openai.com/docs/guides/priority-processing)")
_AZURE_FLEX = ("Azure OpenAI flex processing (learn.microsoft.com/azure/foundry/openai/how-to/flex-processing, "
               "2026-09-24): gpt-5.6-sol (2026-07-09) on Global Standard deployments; 'an unsupported model returns "
               "an HTTP 400 invalid_request_error and doesn't fall back to Standard processing'")
_AZURE_PRIORITY = ("Azure OpenAI priority processing (learn.microsoft.com/azure/foundry/openai/concepts/"
                   "priority-processing): gpt-5.5, gpt-5.4-mini, gpt-5.4, gpt-5.2, gpt-5.1 and gpt-4.1 on Global or "
                   "Data Zone Standard deployments, API version 2025-12-01 or later")
_GEMINI_TIERS = ("Gemini inference tiers (ai.google.dev/gemini-api/docs/flex-inference and /priority-inference; "
                 "google-gemini/cookbook quickstarts/Inference_tiers.ipynb: 'Most Gemini 2.5 and Gemini 3 models "
                 "support inference tiers')")
_GROQ_TIERS = ("Groq service tiers (console.groq.com/docs/service-tiers; console.groq.com/docs/flex-processing: "
               "flex 'is available for all models to paid customers'; the performance tier is for enterprise "
               "contracts and has no public price, so the runner offers no priority on Groq)")

#: the first dated Azure OpenAI API version whose requests take ``service_tier`` (Azure's priority processing page,
#: above; its flex page sends through the undated v1 API, which the runner lets through as it does for reasoning)
AZURE_TIER_VERSION = "2025-12-01"

TIER_RULES: tuple[TierRule, ...] = (
    # -- OpenAI (and sim:, which reads these rules under the model's own name) ------------------------------
    TierRule("openai", r"gpt-5(?:\.\d+)?-chat", (), _OPENAI_TIERS),
    TierRule("openai", r"gpt-5(?:\.\d+)?-codex", ("priority",), _OPENAI_TIERS),
    TierRule("openai", r"gpt-5(?:\.\d+)?-(?:nano|pro)", ("flex",), _OPENAI_TIERS),
    TierRule("openai", r"gpt-(?:[5-9]|\d\d)", ("flex", "priority"), _OPENAI_TIERS),
    TierRule("openai", r"o3(?:-\d{4}-\d\d-\d\d)?$|o4-mini", ("flex", "priority"), _OPENAI_TIERS),
    TierRule("openai", r"gpt-4o|gpt-4\.1", ("priority",), _OPENAI_TIERS),
    TierRule("openai", r"", (), _OPENAI_TIERS),
    # -- Azure OpenAI (by the model behind the deployment) ---------------------------------------------------
    TierRule("azure-openai", r"gpt-5\.6-sol", ("flex",), _AZURE_FLEX),
    TierRule("azure-openai", r"gpt-(?:5\.5|5\.4-mini|5\.4|5\.2|5\.1|4\.1)(?:-\d{4}-\d\d-\d\d)?$", ("priority",),
             _AZURE_PRIORITY),
    TierRule("azure-openai", r"", (), f"{_AZURE_FLEX}; {_AZURE_PRIORITY}"),
    # -- Gemini ---------------------------------------------------------------------------------------------
    TierRule("gemini", r"gemini-(?:2\.5|[3-9])", ("flex", "priority"), _GEMINI_TIERS),
    TierRule("gemini", r"", (), _GEMINI_TIERS),
    # -- Groq -----------------------------------------------------------------------------------------------
    TierRule("groq", r"", ("flex",), _GROQ_TIERS),
)
