"""The bound on an endpoint's requests in flight (runner/engine/limits.py): Little's law where a limit is known, the
ramp where none is, the memory bound, an explicit concurrency, the open-files room, and the connection pool the
providers' clients are told to allow (runner/engine/endpoints.py).

A fake clock drives every endpoint: no test sleeps for real.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from types import SimpleNamespace
from typing import ClassVar

import pytest

from runner.engine import endpoints, limits
from runner.engine.endpoints import Endpoints, connection_pool_size, in_flight_bound
from runner.engine.limits import DEFAULT_MAX_IN_FLIGHT, RESERVED_FILES, Endpoint, Ramp, Slots
from runner.providers.base import ProviderSettings, RateWindow
from tests.fakes import FakeProvider


@pytest.fixture(autouse=True)
def open_files_aplenty(monkeypatch):
    """The process's open-files limit is its own test (in a subprocess): here it bounds nothing."""
    monkeypatch.setattr(limits, "connection_room", lambda wanted: wanted)
    monkeypatch.setattr(endpoints, "connection_room", lambda wanted: wanted)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def opened(endpoint: Endpoint) -> Endpoint:
    endpoint.answered()  # the first answer: the probe is over
    return endpoint


def spent(endpoint: Endpoint) -> Endpoint:
    """The server says nothing is left in any bucket: the key's saved-up minute is gone."""
    for bucket in endpoint.buckets.values():
        bucket.sync(remaining=0, age=0.0)
    return endpoint


def test_in_flight_follows_a_configured_limit_times_the_latency():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", rpm=6000, opening=64, clock=clock, sleep=clock.sleep))
    assert endpoint.slots.limit == 64  # no latency known yet: the provider's opening
    endpoint.observe(None, latency=20.0)
    assert endpoint.slots.limit == DEFAULT_MAX_IN_FLIGHT  # a fresh key's minute (6,000) and 2,500 more: the bound
    spent(endpoint).observe(None, latency=20.0)
    # 100 requests a second for 20 s: 2,000 in flight, with a quarter's headroom and the slack
    assert endpoint.slots.limit == 2508
    for _ in range(200):
        endpoint.observe(None, latency=10.0)  # answers got faster: fewer in flight keep the limit busy
    assert endpoint.latency == pytest.approx(10.0, rel=1e-3)
    assert endpoint.slots.limit == pytest.approx(100 * 10 * 1.25 + 8, abs=1)
    clock.now += 3.0
    endpoint.observe(None, latency=10.0)
    assert endpoint.slots.limit == pytest.approx(300 + 100 * 10 * 1.25 + 8, abs=1)  # 3 s of refill saved up


def test_a_limit_learned_from_headers_ends_the_ramp_and_sets_the_target():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", adaptive=True, clock=clock, sleep=clock.sleep))
    assert endpoint.slots.limit == 4 and endpoint.ramp is not None
    endpoint.observe({"requests": RateWindow(limit=6000, remaining=0)}, latency=20.0)
    # nothing left when the server admitted it, 2,000 refilled in the 20 s since; and Little's law's 2,508
    assert endpoint.ramp is None and endpoint.slots.limit == 2000 + 2508


def test_each_process_sizes_its_in_flight_to_its_share_of_the_limit():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", rpm=6000, clock=clock, sleep=clock.sleep))
    endpoint.set_share(0.25)
    spent(endpoint).observe(None, latency=20.0)
    assert endpoint.slots.limit == 25 * 20 * 1.25 + 8


async def test_a_token_limit_bounds_the_requests_in_flight_by_the_tokens_each_takes():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", rpm=6000, tpm=60_000, clock=clock, sleep=clock.sleep))
    await endpoint.ready(input_tokens=500, output_tokens=500)  # 1,000 tokens a request: 1 request a second
    spent(endpoint).observe(None, latency=20.0)
    assert endpoint.slots.limit == 1 * 20 * 1.25 + 8


async def test_a_token_limit_alone_waits_for_a_request_before_it_counts():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", tpm=60_000, opening=32, clock=clock, sleep=clock.sleep))
    endpoint.observe(None, latency=5.0)
    assert endpoint.in_flight_target() is None and endpoint.slots.limit == 32  # tokens per request unknown
    await endpoint.ready(input_tokens=90, output_tokens=10)
    endpoint.observe(None, latency=5.0)
    assert endpoint.slots.limit == math.ceil((59_900 + 1000 * 5 * 1.25) / 100) + 8  # the minute's tokens, too
    spent(endpoint).observe(None, latency=5.0)
    assert endpoint.slots.limit == math.ceil(10 * 5 * 1.25) + 8


def test_the_memory_bound_caps_the_target():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", rpm=6000, max_in_flight=500, clock=clock, sleep=clock.sleep))
    endpoint.observe(None, latency=20.0)
    assert endpoint.slots.limit == 500
    unbounded = opened(Endpoint("e", rpm=600_000, clock=clock, sleep=clock.sleep))
    unbounded.observe(None, latency=60.0)
    assert unbounded.slots.limit == DEFAULT_MAX_IN_FLIGHT  # the default bound when nothing is set


def test_an_explicit_concurrency_caps_the_target_and_stays_fixed_without_a_limit():
    clock = FakeClock()
    endpoint = spent(opened(Endpoint("e", concurrency=100, rpm=6000, clock=clock, sleep=clock.sleep)))
    endpoint.observe(None, latency=20.0)
    assert endpoint.slots.limit == 100  # Little's law wants 2,508: the user's concurrency wins
    below = spent(opened(Endpoint("e", concurrency=100, rpm=600, clock=clock, sleep=clock.sleep)))
    below.observe(None, latency=2.0)
    assert below.slots.limit == 10 * 2 * 1.25 + 8  # under the cap, Little's law still sizes it
    fixed = opened(Endpoint("e", concurrency=100, clock=clock, sleep=clock.sleep))
    for _ in range(1000):
        fixed.observe(None, latency=0.01)
    assert fixed.slots.limit == 100 and fixed.ramp is None  # no limit known: exactly the user's concurrency
    above = opened(Endpoint("e", concurrency=20_000, rpm=600_000, clock=clock, sleep=clock.sleep))
    above.observe(None, latency=60.0)
    assert above.slots.limit == 20_000  # an explicit concurrency is not cut to the default memory bound
    both = opened(Endpoint("e", concurrency=300, max_in_flight=200, rpm=6000, clock=clock, sleep=clock.sleep))
    both.observe(None, latency=20.0)
    assert both.slots.limit == 200  # an explicit memory bound below it is


def test_the_ramp_doubles_per_window_of_clean_answers():
    slots = Slots(4)
    ramp = Ramp(slots, ceiling=1000, clock=FakeClock())
    sizes = []
    for _ in range(5):
        for _ in range(ramp.size):
            ramp.success(2.0)
        sizes.append(slots.limit)
    assert sizes == [8, 16, 32, 64, 128] and ramp.doubling


def test_the_ramp_stops_at_the_ceiling():
    slots = Slots(4)
    ramp = Ramp(slots, ceiling=50, clock=FakeClock())
    for _ in range(1000):
        ramp.success(0.01)
    assert slots.limit == 50


def test_rising_latency_cuts_the_ramp_to_what_the_server_served_without_queueing_then_growth_is_additive():
    slots = Slots(4)
    ramp = Ramp(slots, ceiling=10_000, clock=FakeClock(), step=4)
    while slots.limit < 64:
        ramp.success(1.0)
    assert slots.limit == 64 == ramp.size and ramp.floor == pytest.approx(1.0)
    for _ in range(64):
        ramp.success(3.0)  # the server queues: three times the floor, while the bound grew to 128
    assert not ramp.doubling
    assert slots.limit == 128 // 3  # Little's law: what it served at the floor's latency
    for _ in range(ramp.size):
        ramp.success(1.0)
    assert slots.limit == 128 // 3 + 4  # clean again: one step per window, no more doubling
    for _ in range(ramp.size):
        ramp.success(1.2)  # a little slower, not queueing
    assert slots.limit == 128 // 3 + 8


def test_errors_halve_the_ramp_once_per_latency_window():
    clock = FakeClock()
    slots = Slots(4)
    ramp = Ramp(slots, ceiling=10_000, clock=clock)
    while slots.limit < 128:
        ramp.success(0.5)
    ramp.failure()
    assert slots.limit == 64 and not ramp.doubling
    ramp.failure()  # the same burst of 429s: counted once
    assert slots.limit == 64
    clock.now += 1.0  # two floors later
    ramp.failure()
    assert slots.limit == 32
    for _ in range(40):
        ramp.failure()
        clock.now += 1.0
    assert slots.limit == 1  # never below one


def test_an_endpoint_ramps_from_its_start_and_backs_off_on_429s():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", adaptive=True, clock=clock, sleep=clock.sleep))
    for _ in range(4 + 8 + 16):
        endpoint.observe(None, latency=2.0)
    assert endpoint.slots.limit >= 32  # doubled per window, not one more per window as before
    before = endpoint.slots.limit
    endpoint.failed()
    assert endpoint.slots.limit == before // 2


def test_an_endpoint_ramps_up_to_its_memory_bound():
    clock = FakeClock()
    endpoint = opened(Endpoint("e", adaptive=True, max_in_flight=300, clock=clock, sleep=clock.sleep))
    for _ in range(5000):
        endpoint.observe(None, latency=2.0)
    assert endpoint.slots.limit == 300


class RampingProvider(FakeProvider):
    adaptive: ClassVar[bool] = True


async def test_endpoints_are_built_with_the_jobs_bound_and_the_providers_settings():
    request = SimpleNamespace(provider="p", model_name="m")
    limited = Endpoints({"p": FakeProvider(ProviderSettings(rpm=6000))}, max_in_flight=300).of(request)
    assert limited.ceiling == 300 and limited.ramp is None
    limited.answered()
    assert limited.slots.limit == FakeProvider.default_concurrency  # until a latency is known
    limited.observe(None, latency=20.0)
    assert limited.slots.limit == 300
    ramping = opened(Endpoints({"p": RampingProvider(ProviderSettings())}).of(request))
    # no limit known: a ramp from the provider's default, up to the default memory bound
    assert ramping.ramp is not None and ramping.ceiling == DEFAULT_MAX_IN_FLIGHT
    assert ramping.slots.limit == RampingProvider.default_concurrency
    fixed = Endpoints({"p": RampingProvider(ProviderSettings(concurrency=5))}, max_in_flight=300).of(request)
    fixed.answered()
    assert fixed.ramp is None and fixed.slots.limit == 5 and fixed.ceiling == 5


def test_bounds_from_settings():
    assert in_flight_bound(ProviderSettings()) is None
    assert in_flight_bound(ProviderSettings(), job_bound=700) == 700
    assert connection_pool_size(ProviderSettings()) == DEFAULT_MAX_IN_FLIGHT
    assert connection_pool_size(ProviderSettings(), job_bound=700) == 700
    assert connection_pool_size(ProviderSettings(concurrency=50), job_bound=700) == 50
    assert connection_pool_size(ProviderSettings(concurrency=5000), job_bound=700) == 700
    assert connection_pool_size(ProviderSettings(), job_bound=700, endpoints=3) == 2100


ROOM = """
import json, resource, sys
from runner.engine.limits import connection_room
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
got = connection_room(int(sys.argv[3]))
print(json.dumps([got, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
"""


def room(soft: int, hard: int, wanted: int) -> list[int]:
    out = subprocess.run([sys.executable, "-c", ROOM, str(soft), str(hard), str(wanted)], capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_the_open_files_limit_is_raised_for_the_connections_or_bounds_them():
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    top = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)  # a process may lower its hard limit only
    if top < 1024:
        pytest.skip(f"a hard open-files limit of {top} leaves no room to test in")
    fits = top - RESERVED_FILES - 100
    assert room(top, top, fits) == [fits, top]  # room enough: nothing changes
    assert room(512, top, fits) == [fits, fits + RESERVED_FILES]  # the soft limit raised as far as needed
    assert room(512, top, 2 * top) == [top - RESERVED_FILES, top]  # the hard limit bounds the connections


async def test_the_jobs_max_in_flight_reaches_the_dispatchers_endpoints_and_a_providers_own_wins(tmp_path, monkeypatch):
    from runner.engine.assembly import assemble
    from runner.engine.stats import RunStats
    from runner.providers.base import provider_class
    from runner.spec.job import job_from_dict
    from runner.store import Writer, open_store

    (tmp_path / "d.jsonl").write_text('{"q": "a"}\n', encoding="utf-8")
    job = job_from_dict({"name": "j", "models": ["sim:m"], "max_in_flight": 300,
                         "providers": {"sim": {"rpm": 6000}},
                         "stages": [{"name": "s", "dataset": {"path": str(tmp_path / "d.jsonl")},
                                     "prompt": {"user": "{{ q }}"}}]}, base_dir=tmp_path)
    store = open_store(tmp_path / "s.sqlite")
    providers = {"sim": provider_class("sim")(job.providers["sim"])}
    dispatcher = assemble(run_id="r", job=job, store=store, writer=Writer(store, lambda batch: None),
                          providers=providers, stats=RunStats())
    endpoint = dispatcher.endpoints.of(SimpleNamespace(provider="sim", model_name="m"))
    assert endpoint.ceiling == 300
    own = Endpoints({"p": FakeProvider(ProviderSettings(rpm=6000, max_in_flight=40))}, max_in_flight=300)
    assert own.of(SimpleNamespace(provider="p", model_name="m")).ceiling == 40


def test_the_sdk_clients_pools_are_sized_to_the_endpoints_bound():
    import openai

    from runner.providers.bounded_httpx import http_limits

    client = openai.DefaultAioHttpClient
    assert http_limits(ProviderSettings(concurrency=1500), client).max_connections == 1500
    assert http_limits(ProviderSettings(max_in_flight=2500), client).max_keepalive_connections == 2500
    assert http_limits(ProviderSettings(), client).max_connections == connection_pool_size(ProviderSettings())


async def test_the_jobs_max_in_flight_sizes_the_sdk_clients_pool(tmp_path, monkeypatch):
    # the engine builds the providers with the pool their endpoints' bound needs, the job's max_in_flight included;
    # the provider's SDK client is made with it (the providers never import the engine to learn it)
    from runner.engine.checks import build_providers
    from runner.spec.job import job_from_dict

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    (tmp_path / "d.jsonl").write_text('{"q": "a"}\n', encoding="utf-8")
    job = job_from_dict({"name": "j", "models": ["openai:gpt-4o"], "max_in_flight": 7,
                         "stages": [{"name": "s", "dataset": {"path": str(tmp_path / "d.jsonl")},
                                     "prompt": {"user": "{{ q }}"}}]}, base_dir=tmp_path)
    provider = build_providers(job)["openai"]
    await provider.start()
    try:
        pool = provider.client._client._transport.inner.limits  # the SDK's aiohttp transport, bounded
        assert pool.max_connections == pool.max_keepalive_connections == connection_pool_size(
            ProviderSettings(), job_bound=7) == 7
    finally:
        await provider.aclose()
