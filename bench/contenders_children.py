"""The child processes of ``bench/contenders.py``: one run of one other tool against the simulated server.

    python bench/contenders_children.py cookbook|curator|litellm SPEC.json

SPEC.json (written by the parent) holds the server's ``url`` (its ``/v1`` base), ``model``, ``max_tokens``,
``concurrency``, ``timeout`` (seconds per batch), the ``warm`` and measured ``prompts`` (bench/throughput_common.py's
``bare_prompt``), a fresh ``workdir`` and, for the cookbook, the path of its script. Each driver sends the warm-up
batch, then the measured one, and prints one line ``CPU {json}``: ``cpu`` (this process's CPU seconds around the
measured batch, plus any child processes it reaped), ``seconds`` (wall), ``answered`` (answers with text) and
``versions``.

This file runs inside each tool's own virtualenv (bench/contenders_setup.sh), so it imports the standard library
and that one tool only: nothing of the project (the cookbook's script runs in the project's venv, which has its
aiohttp and tiktoken). Everything that would reach past 127.0.0.1 (telemetry, the cost map's download, a hosted
viewer) is switched off before the tool is imported; tiktoken's cl100k_base is read from ``TIKTOKEN_CACHE_DIR``,
set by the parent; every cache a tool keeps points into ``workdir``, so nothing is served from an earlier run.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the key every tool sends (the simulated server takes any non-empty one)
KEY = "sk-bench"


def measured(batch: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Runs ``batch``: what it returns, and its CPU seconds (this process's and its reaped children's) and wall."""
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, began = time.process_time(), time.perf_counter()
    result = batch()
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    return result, {"cpu": cpu, "seconds": seconds}


def versions(*packages: str) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def body(spec: dict[str, Any], prompt: str) -> dict[str, Any]:
    """The Chat Completions request the bare aiohttp loop of bench/throughput_cpu.py sends."""
    return {"model": spec["model"], "messages": [{"role": "user", "content": prompt}],
            "max_tokens": spec["max_tokens"], "temperature": 0}


# -- OpenAI's cookbook: examples/api_request_parallel_processor.py, imported from the path given ----------------

def cookbook(spec: dict[str, Any]) -> dict[str, Any]:
    """Writes each batch as the requests JSONL the script reads and awaits its ``process_api_requests_from_file``.

    Two things are set here, not in the script: its endpoint, because ``api_endpoint_from_url`` only reads
    ``https://`` URLs and the simulated server is plain http on 127.0.0.1 (the function is replaced on the
    imported module by one answering ``chat/completions``, what it returns for the same URL over https); and its
    limits, far above what one process can send, so that it is bound by CPU and not by its own throttle. Logging
    is at WARNING, as its INFO level writes a line per request. It has no concurrency bound of its own: its loop
    starts at most one request per 1 ms pass, and aiohttp's default pool holds 100 connections.
    """
    loader = importlib.util.spec_from_file_location("api_request_parallel_processor", spec["cookbook"])
    if loader is None or loader.loader is None:
        raise SystemExit(f"cannot import {spec['cookbook']}")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    script.api_endpoint_from_url = lambda url: "chat/completions"
    work = Path(spec["workdir"])

    def write(name: str, prompts: list[str]) -> tuple[Path, Path]:
        requests = work / f"{name}.jsonl"
        requests.write_text("".join(json.dumps(body(spec, p)) + "\n" for p in prompts), encoding="utf-8")
        return requests, work / f"{name}_results.jsonl"

    def send(requests: Path, results: Path) -> None:
        asyncio.run(asyncio.wait_for(script.process_api_requests_from_file(
            requests_filepath=str(requests), save_filepath=str(results), request_url=spec["url"] + "/chat/completions",
            api_key=KEY, max_requests_per_minute=1e9, max_tokens_per_minute=1e12, token_encoding_name="cl100k_base",
            max_attempts=5, logging_level=30), spec["timeout"]))

    send(*write("warm", spec["warm"]))
    requests, results = write("measured", spec["prompts"])
    _, figures = measured(lambda: send(requests, results))
    answered = 0
    for line in results.read_text(encoding="utf-8").splitlines():
        answer = json.loads(line)[1]
        answered += isinstance(answer, dict) and bool(answer["choices"][0]["message"]["content"])
    return {**figures, "answered": answered, "versions": versions("aiohttp", "tiktoken")}


# -- Bespoke Labs' Curator ------------------------------------------------------------------------------------

def curator(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``curator.LLM`` on the OpenAI backend, called on the warm-up prompts and then on the measured ones.

    Its limits are given (so it does not take them from the probe request it sends when the backend is built, which
    reaches the server as one extra, refused request); concurrency is ``concurrency`` like every other contender.
    Its cache, the Hugging Face datasets cache and its metadata folder are in a fresh ``workdir``, so every
    prompt is sent; each call still writes its requests, responses and the resulting dataset (Arrow) there, as it
    always does. Telemetry and the hosted viewer are off; its progress display is left at its default (rich;
    with stderr a pipe, cheaper than the tqdm bar ``CURATOR_DISABLE_RICH_DISPLAY`` switches to: 3.2 against 3.6 ms
    per request when this was written).
    """
    work = Path(spec["workdir"])
    os.environ.update({"CURATOR_CACHE_DIR": str(work / "curator"), "HF_HOME": str(work / "hf"), "HOME": str(work),
                       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TELEMETRY_ENABLED": "false",
                       "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true"})
    os.environ.pop("CURATOR_VIEWER", None)
    from bespokelabs import curator as bespoke

    llm = bespoke.LLM(model_name=spec["model"], backend="openai",
                      generation_params={"max_tokens": spec["max_tokens"], "temperature": 0},
                      backend_params={"base_url": spec["url"], "api_key": KEY, "max_requests_per_minute": 10**9,
                                      "max_tokens_per_minute": 10**12,
                                      "max_concurrent_requests": spec["concurrency"],
                                      "request_timeout": int(spec["timeout"])})

    llm(spec["warm"])
    response, figures = measured(lambda: llm(spec["prompts"]))
    answered = sum(bool(row["response"]) for row in response.dataset)
    return {**figures, "answered": answered,
            "versions": versions("bespokelabs-curator", "aiohttp", "litellm", "datasets", "pyarrow")}


# -- LiteLLM's Router -------------------------------------------------------------------------------------------

def litellm(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``litellm.Router`` with one deployment (``openai/MODEL`` at the server), ``await router.acompletion``
    from ``concurrency`` worker tasks (the bare aiohttp loop's shape). Cost map local, offline mode on, no
    callbacks set; everything else as LiteLLM defaults it."""
    os.environ.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
                       "HOME": spec["workdir"]})
    import litellm as lite

    lite.telemetry = False
    router = lite.Router(model_list=[{"model_name": spec["model"], "litellm_params": {
        "model": "openai/" + spec["model"], "api_base": spec["url"], "api_key": KEY}}])

    async def send(prompts: list[str]) -> int:
        todo, answered = iter(prompts), 0

        async def worker() -> None:
            nonlocal answered
            for prompt in todo:
                answer = await router.acompletion(model=spec["model"], max_tokens=spec["max_tokens"], temperature=0,
                                                  messages=[{"role": "user", "content": prompt}])
                answered += bool(answer.choices[0].message.content)

        async with asyncio.timeout(spec["timeout"]):
            await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
        return answered

    async def go() -> dict[str, Any]:
        await send(spec["warm"])
        cpu0, began = time.process_time(), time.perf_counter()
        answered = await send(spec["prompts"])
        return {"cpu": time.process_time() - cpu0, "seconds": time.perf_counter() - began, "answered": answered}

    return {**asyncio.run(go()), "versions": versions("litellm", "aiohttp", "httpx", "openai", "pydantic")}


DRIVERS = {"cookbook": cookbook, "curator": curator, "litellm": litellm}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in DRIVERS:
        print(f"usage: python {sys.argv[0]} {'|'.join(DRIVERS)} SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    print("CPU " + json.dumps(DRIVERS[argv[0]](spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
