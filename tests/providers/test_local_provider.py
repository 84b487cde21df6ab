"""The embedded model reuses prompt prefixes, and the same prompt still gets the same answer, bit for bit.

Each check runs the real model (SmolLM2-135M-Instruct Q4_1) and compares, for one prompt, the answer and a digest
of every generation step's full logits vector between a fresh evaluation (llama-cpp-python's ``Llama`` reset
before the request: the provider's code before prefix reuse) and the reusing provider after other prompts that
share a prefix with it. A difference in the last bit of one logit would show.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import threading
from typing import Any

import pytest

from runner.errors import ModelSetupError
from runner.providers.base import ProviderSettings
from runner.providers.local import LocalProvider
from runner.providers.local_llama import LEGACY_N_BATCH, batch_sizes, min_suffix

SYSTEM = 'Please answer the following question by printing exactly one option from "A", "B", "C", "D", ' \
         "without explanation."


def question(text: str, options: list[str]) -> list[dict[str, str]]:
    block = "\n".join(f"{letter}. {option}" for letter, option in zip("ABCD", options, strict=True))
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Exercise: choose the most plausible alternative.\n\n{text}\n{block}\n"
                                        "Answer: "}]


STORY = ("Sally went to the market on Saturday morning with her little brother Tom. They bought apples, bread "
         "and a small blue kite, and on the way home they stopped at the park to fly it.")
OPTIONS = ["the apples", "the bread", "the kite", "the park"]
TARGET = question(f"{STORY}\nWhat did they fly in the park?", OPTIONS)
#: the same story and question, the options in another order: shares everything up to the options
SHUFFLED = question(f"{STORY}\nWhat did they fly in the park?", OPTIONS[::-1])
#: the same story, another question: shares the prefix up to the question
OTHER_QUESTION = question(f"{STORY}\nWho went to the market with Sally?", ["Tom", "Ann", "Bob", "Sue"])
#: nothing in common beyond the chat template's first tokens
UNRELATED = [{"role": "user", "content": "Name a colour."}]
PARAMS = {"temperature": 0, "max_tokens": 12}


class Probe:
    """A started provider whose model reports a digest of each step's logits for the last request."""

    def __init__(self, reuse_prefix: bool) -> None:
        self.provider = LocalProvider(ProviderSettings(), reuse_prefix=reuse_prefix)

    async def __aenter__(self) -> Probe:
        await self.provider.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.provider.aclose()

    @property
    def llm(self) -> Any:
        return self.provider.llm

    async def ask(self, messages: list[dict[str, str]], params: dict[str, Any] = PARAMS) -> tuple[str, str]:
        import llama_cpp
        import numpy as np

        llm = self.llm
        generate = type(llm).generate
        digest = hashlib.sha256()
        steps = []

        def metered(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            for token in generate(llm, tokens, *args, **kwargs):
                steps.append(token)
                logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
                digest.update(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).tobytes())
                yield token

        llm.generate = metered
        try:
            done = await self.provider.execute("smollm2", messages, params)
        finally:
            del llm.generate
        assert steps, "no token was generated"
        return done.text, digest.hexdigest()

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's tokens as the chat template renders them, without evaluating anything."""

        class Captured(Exception):
            pass

        def capture(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            raise Captured(list(tokens))

        self.llm.generate = capture
        try:
            self.llm.create_chat_completion(messages=messages, max_tokens=1)
        except Captured as got:
            return got.args[0]
        finally:
            del self.llm.generate
        raise AssertionError("the prompt was never generated from")


def test_batches_compute_each_position_as_a_fresh_evaluation_does():
    # a fresh evaluation from position 0 is cut as llama-cpp-python's default n_batch cut it
    assert batch_sizes(0, 150, 512) == [150]
    assert batch_sizes(0, 625, 512) == [512, 113]
    assert batch_sizes(0, 513, 512) == [512, 1]  # 512 * 1 + 1 tokens: the last alone, as before
    # a suffix after a reused prefix: every token in a batch of two or more, but that same last token
    assert batch_sizes(100, 413, 512) == [412, 1]
    assert batch_sizes(511, 514, 512) == [511, 2, 1]  # no token alone in the middle
    assert batch_sizes(40, 472, 512) == [472]
    assert batch_sizes(7, 1, 512) == [1]  # a generated token
    assert min_suffix(150) == 2 and min_suffix(LEGACY_N_BATCH + 1) == 3


@pytest.mark.slow  # dozens of prompts on the embedded model: over a minute
async def test_the_same_prompt_gets_the_same_answer_after_prompts_sharing_its_prefix():
    async with Probe(reuse_prefix=False) as fresh:
        expected = await fresh.ask(TARGET)
        assert await fresh.ask(TARGET) == expected  # the reference itself is deterministic
    async with Probe(reuse_prefix=True) as reusing:
        llm = reusing.llm
        assert await reusing.ask(TARGET) == expected  # nothing ran before it

        before = llm.reused
        await reusing.ask(SHUFFLED)  # reuses TARGET's prefix (the story and question)
        assert await reusing.ask(TARGET) == expected  # reuses SHUFFLED's
        assert llm.reused - before > 2 * 60, "the prefixes were evaluated again, not reused"

        assert await reusing.ask(TARGET) == expected  # the whole prompt was just evaluated: all but 2 reused

        await reusing.ask(OTHER_QUESTION)
        await reusing.ask(UNRELATED)
        before = llm.reused
        assert await reusing.ask(TARGET) == expected  # from a saved state: the context held UNRELATED
        assert llm.reused - before >= len(reusing.prompt_tokens(TARGET)) - 2


@pytest.mark.slow  # a long prompt on the embedded model: about half a minute
async def test_a_prompt_whose_last_token_was_evaluated_alone_keeps_its_answer():
    """A prompt of 512k + 1 tokens: a fresh evaluation computes its last token in a batch of one, which gives
    other logits than a batch of two; the reusing model computes it alone too."""
    async with Probe(reuse_prefix=False) as fresh:
        words = 300  # " and" is one token
        for _ in range(4):
            long_prompt = question(f"{STORY} " + "and " * words + "they went home.", OPTIONS)
            length = len(fresh.prompt_tokens(long_prompt))
            if length == LEGACY_N_BATCH + 1:
                break
            words += LEGACY_N_BATCH + 1 - length
        assert length == LEGACY_N_BATCH + 1, length
        expected = await fresh.ask(long_prompt)
    sharing = [dict(m) for m in long_prompt]
    sharing[-1]["content"] = sharing[-1]["content"].replace("Answer: ", "Your answer: ")
    async with Probe(reuse_prefix=True) as reusing:
        await reusing.ask(sharing)
        before = reusing.llm.reused
        assert await reusing.ask(long_prompt) == expected
        assert reusing.llm.reused - before > 400
        assert await reusing.ask(long_prompt) == expected  # in the cache whole: its last 3 tokens evaluated


async def test_a_prompt_longer_than_the_context_is_a_bad_request_and_the_model_goes_on():
    from runner.errors import BadRequest

    provider = LocalProvider(ProviderSettings(n_ctx=256))
    await provider.start()
    try:
        with pytest.raises(BadRequest):
            await provider.execute("smollm2", question("word " * 400, OPTIONS), PARAMS)
        done = await provider.execute("smollm2", TARGET, PARAMS)  # and the model still answers afterwards
        assert done.text
    finally:
        await provider.aclose()


@pytest.mark.slow  # the embedded model loaded twice: 6 s
async def test_each_weights_file_is_loaded_on_its_first_request_and_kept(tmp_path, monkeypatch):
    """A path names its own file, loaded beside the aliases' one; a provider asked only for a path never looks for
    the embedded model (here it is nowhere: finding it would mean a download)."""
    import shutil

    from runner.providers import local_weights

    embedded = local_weights.embedded_gguf()
    assert embedded is not None, "the embedded model's file is not on this machine"
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(embedded, copy)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(local_weights, "installed_gguf", lambda: None)
    monkeypatch.setattr(local_weights, "fetch_gguf", lambda target: pytest.fail("the embedded model was looked for"))
    short = {"temperature": 0, "max_tokens": 3}
    provider = LocalProvider(ProviderSettings())
    await provider.start()
    try:
        by_path = await provider.execute(str(copy), TARGET, short)
        assert list(provider.models) == [copy.resolve()]
        monkeypatch.setenv("RUNNER_LOCAL_MODEL", str(embedded))  # the aliases run the original file
        by_alias = await provider.execute("smollm2", TARGET, short)
        assert list(provider.models) == [copy.resolve(), embedded]
        assert by_alias.text == by_path.text  # the same weights, the same answer
        assert (await provider.execute(str(copy), TARGET, short)).text == by_path.text and len(provider.models) == 2
    finally:
        await provider.aclose()
    assert provider.models == {}


async def test_probe_reads_the_weights_files_header_without_loading_the_model(tmp_path, monkeypatch):
    from runner.providers import local_weights

    embedded = local_weights.embedded_gguf()
    assert embedded is not None, "the embedded model's file is not on this machine"
    provider = LocalProvider(ProviderSettings())
    await provider.probe("smollm2")
    await provider.probe(str(embedded))
    assert provider.models == {}, "the probe loaded the model"

    missing = tmp_path / "missing.gguf"
    monkeypatch.setenv("RUNNER_LOCAL_MODEL", str(missing))
    with pytest.raises(ModelSetupError) as error:
        await LocalProvider(ProviderSettings()).probe("smollm2")
    assert str(missing) in str(error.value) and "RUNNER_LOCAL_MODEL" in str(error.value)

    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not weights\n")
    with pytest.raises(ModelSetupError) as error:
        await LocalProvider(ProviderSettings(model_path=str(not_gguf))).probe("smollm2")
    assert f"{not_gguf} is not a GGUF file" in str(error.value) and "model_path" in str(error.value)

    assert "\n" not in str(error.value)


async def test_probe_of_a_weights_file_that_cannot_be_read_names_the_file_and_the_setting():
    # /proc/self/mem is a file that cannot be read from its start, even by root (EIO)
    provider = LocalProvider(ProviderSettings(model_path="/proc/self/mem"))
    with pytest.raises(ModelSetupError) as error:
        await provider.probe("smollm2")
    message = str(error.value)
    assert message.startswith("local:smollm2: the model file /proc/self/mem cannot be read (")
    assert "model_path" in message and "\n" not in message


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is a Linux feature")
async def test_the_model_runs_in_its_own_lower_priority_thread_one_call_after_the_other():
    from runner.providers.local import WORKER_NICE

    def whoami() -> tuple[int, int]:
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    provider = LocalProvider(ProviderSettings())
    try:
        first, second = await asyncio.gather(provider._in_worker(whoami), provider._in_worker(whoami))
    finally:
        await provider.aclose()
    assert first[0] == second[0] != threading.get_native_id()  # one worker thread, not the event loop's
    assert first[1] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
    assert provider._worker is None


def test_the_models_threads_sleep_while_they_wait_unless_the_environment_says_otherwise(monkeypatch) -> None:
    """OMP_WAIT_POLICY is PASSIVE before llama_cpp loads (spinning threads made a 12.6 s job take 26 s alone and
    463 s beside one busy process: bench/RESULTS.md), and a value the user set is kept. The model's process sees it:
    a subprocess that loads the provider and then llama_cpp reports what its OpenMP runtime was given."""
    import subprocess

    from runner.providers.local_llama import sleeping_openmp_threads

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    sleeping_openmp_threads()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    sleeping_openmp_threads()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    probe = ("import os\nfrom runner.providers.local_llama import without_extra_buffers\n"
             "with without_extra_buffers():\n    import llama_cpp\nprint(os.environ.get('OMP_WAIT_POLICY'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "PASSIVE", done.stderr


async def test_the_answer_is_the_same_bit_for_bit_with_one_thread_or_two():
    """llama.cpp splits each product's rows between its threads, so the thread count (RUNNER_LOCAL_THREADS, or the
    job's ``providers: {local: {n_threads: N}}``) changes the time an answer takes, never its logits."""
    found = []
    for threads in (1, 2):
        probe = Probe(reuse_prefix=False)
        probe.provider = LocalProvider(ProviderSettings(n_threads=threads), reuse_prefix=False)
        async with probe:
            assert probe.llm.context_params.n_threads == threads
            found.append(await probe.ask(TARGET))
    assert found[0] == found[1]


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5", "257"])
def test_a_thread_count_that_is_no_count_is_refused_naming_the_variable(monkeypatch, value):
    from runner.providers.local_weights import THREADS_ENV, default_threads

    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(ModelSetupError, match=f"^RUNNER_LOCAL_THREADS='{value}' is not a number of threads from 1"):
        default_threads()
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    monkeypatch.delenv(THREADS_ENV)
    assert default_threads() == 2


def test_validate_refuses_a_bad_thread_count_in_one_sentence_before_anything_runs(monkeypatch, capsys):
    from tests.helpers import ROOT, run_cli

    monkeypatch.setenv("RUNNER_LOCAL_THREADS", "many")
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(ROOT / "jobs" / "quickstart.yaml"))
    assert code == 2, err
    assert err.count("\n") == 1 and "quickstart.yaml" in err
    assert "RUNNER_LOCAL_THREADS='many' is not a number of threads from 1 to 256" in err


def test_weights_that_fail_to_load_say_so_in_one_sentence_with_no_stray_traceback(tmp_path, monkeypatch):
    """Issue 37: a GGUF file llama.cpp cannot load ended the run in one sentence, then printed "Exception ignored
    in Llama.__del__" with a traceback: the half-built model's close() read prefix states it never had."""
    import gc

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 400)  # the magic bytes, then nothing llama.cpp can read
    unraised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraised.append)
    for reuse in (True, False):
        with pytest.raises(ModelSetupError, match=f"the local model {bad} could not be loaded"):
            LocalProvider(ProviderSettings(), reuse_prefix=reuse)._load(bad)
        gc.collect()
    assert [hook.exc_value for hook in unraised] == []
