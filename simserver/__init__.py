"""The simulated LLM provider server, one concern per module.

    config      :class:`SimConfig`, the knobs, and their validation.
    answers     the deterministic answer, token counts and the message digest.
    buckets     per-model token-bucket rate limits.
    wire        what the wire formats share: the request, the format protocol, JSON responses.
    openai, anthropic, gemini
                one wire format each: request mapping, key header, rate-limit headers, answer and errors.
    completions OpenAI legacy Completions (``/v1/completions``): echo, logprobs, the token and logprob rule.
    respond     the answer body of a parsed request, shared by the online routes and the batch lines.
    batches     the Batch APIs' shared state: batches, files, delay, expiry and per-line errors.
    batch_openai, batch_anthropic, batch_gemini
                OpenAI Files + Batches, Anthropic Message Batches, Gemini batch mode (inlined requests).
    script      response scripts: a YAML file of answers keyed by prompt template, term and model.
    server      :class:`SimServer`: routes, key check, fault draw, counters; :func:`start_server`, :func:`serve`.

``simserver.cli`` is the command line (``python -m simserver``).
"""

from .answers import message_digest, simulated_reply
from .config import SimConfig
from .server import SimServer, serve, start_server

__all__ = ["SimConfig", "SimServer", "message_digest", "serve", "simulated_reply", "start_server"]
