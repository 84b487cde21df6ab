"""``runner view``'s web app: aiohttp.web routes over one store, pages from Jinja2 templates (runner/view/templates/,
autoescaped: a run's texts are always shown as text), JSON endpoints for the pages' polling. Read-only: no route
writes to the store.

Pages: ``/`` the runs, ``/runs/{id}`` a run (the static HTML report's rendering), ``/runs/{id}/answers`` its
answers (searched and filtered, paged), ``/compare`` two or more runs or models, ``/costs`` spend and savings.
JSON: ``/api/runs`` and ``/api/runs/{id}/answers``, paged as their pages are; ``/api/runs/{id}/explain`` (runner
explain's answer for one item, which the answers page's "why not a cache hit" panel shows). A run's page re-prices
it (``?as=MODEL&batch=1&cached=1``, as ``runner costs RUN --as`` does).

Every read is the store's: its paged reads (runs, answers, filter choices, savings) are
:class:`~runner.store.view_reads.ViewReads`, the rest the reports' (runner/report/). Here a run is only shown: a
run recorded as running whose process is gone is ``crashed``, a running one has its pace.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from runner.errors import RunnerError
from runner.processes import pid_alive
from runner.report import compare as comparisons
from runner.report import costs as spend
from runner.report import explain as explanations
from runner.report import html as html_report
from runner.report import whatif
from runner.report.item_scores import stage_items
from runner.store import Store
from runner.store.view_reads import ANSWER_OUTCOMES, RUN_SORTS, AnswerFilter, RunFilter, ViewReads
from runner.view.guard import Guard

__all__ = ["PAGE_SIZE", "STORE", "make_app"]

STORE: web.AppKey[Store] = web.AppKey("store", Store)
READS: web.AppKey[ViewReads] = web.AppKey("reads", ViewReads)
TEMPLATES: web.AppKey[jinja2.Environment] = web.AppKey("templates", jinja2.Environment)
#: rows per page of runs and of answers (``?limit=`` up to MAX_PAGE)
PAGE_SIZE = 50
MAX_PAGE = 500
#: the largest ?offset= taken (a larger one overflows the databases' 64-bit OFFSET: a 500 before it was refused)
MAX_OFFSET = 10**15
#: answers of a run embedded in its page (the answers page has them all, paged)
RUN_PAGE_SAMPLES = 20
#: items listed where two sides disagree
MAX_DISAGREEMENTS = 200


def make_app(store: Store, guard: Guard | None = None) -> web.Application:
    """The viewer over ``store``; ``guard`` says who may read it (runner/view/guard.py: by default its own address
    only, without a token; ``runner view`` gives it a token)."""
    app = web.Application(middlewares=[(guard or Guard()).middleware, _errors])
    app[STORE] = store
    app[READS] = ViewReads(store)
    app[TEMPLATES] = jinja2.Environment(loader=jinja2.PackageLoader("runner.view", "templates"), autoescape=True,
                                        undefined=jinja2.StrictUndefined)
    app.router.add_get("/", runs_page)
    app.router.add_get("/api/runs", runs_json)
    app.router.add_get("/runs/{run}", run_page)
    app.router.add_get("/runs/{run}/answers", answers_page)
    app.router.add_get("/api/runs/{run}/answers", answers_json)
    app.router.add_get("/api/runs/{run}/explain", explain_json)
    app.router.add_get("/compare", compare_page)
    app.router.add_get("/costs", costs_page)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """A RunnerError (an unknown run, runs that share nothing, a bad parameter) as a page saying it."""
    try:
        return await handler(request)
    except RunnerError as exc:
        if request.path.startswith("/api/"):
            return web.json_response({"error": str(exc)}, status=400)
        return _page(request, "error.html", status=400, title="Error", message=str(exc))


def _page(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    text = request.app[TEMPLATES].get_template(template).render(**context)
    return web.Response(text=text, content_type="text/html", charset="utf-8", status=status,
                        headers={"Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline';"
                                 " style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"})


def _int(request: web.Request, name: str, default: int, high: int | None = None) -> int:
    text = request.query.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise RunnerError(f"?{name}= takes a whole number, not {text!r}") from None
    if not 0 <= value <= MAX_OFFSET:
        raise RunnerError(f"?{name}= takes a number from 0 to {MAX_OFFSET:,}, not {value}")
    return min(value, high) if high is not None else value


# -- runs ------------------------------------------------------------------------------------------------
def _run_filter(request: web.Request) -> RunFilter:
    sort = request.query.get("sort", "started")
    if sort not in RUN_SORTS:
        raise RunnerError(f"?sort= is one of {', '.join(RUN_SORTS)}, not {sort!r}")
    return RunFilter(text=request.query.get("q", "").strip(), status=request.query.get("status", ""), sort=sort,
                     descending=request.query.get("order", "desc") != "asc",
                     limit=_int(request, "limit", PAGE_SIZE, MAX_PAGE), offset=_int(request, "offset", 0))


def _runs(request: web.Request, f: RunFilter) -> tuple[list[dict[str, Any]], int]:
    """(a page of runs as the pages show them, how many match): a run recorded as running whose process is gone is
    ``crashed``; a running one has its pace; its budget and models are its job's."""
    found, total = request.app[READS].runs(f)
    runs = []
    for r in found:
        status = r["status"]
        if status == "running" and not pid_alive(r["pid"]):
            status = "crashed"
        finished, failed, total_tasks = r["finished_tasks"], r["failed"], int(r["total"] or 0)
        rate, eta = _pace(finished, total_tasks, r["started"]) if status == "running" else (None, None)
        runs.append({"id": r["id"], "job": r["job_name"], "status": status, "done": finished - failed,
                     "failed": failed, "total": total_tasks, "score": r["score"], "spend": round(r["spend"], 10),
                     "budget": (r["job"].get("budget") or {}).get("usd"),
                     "models": [str(m) for m in r["job"].get("models") or []], "started": r["started"] or r["created"],
                     "finished": r["finished"], "message": r["message"], "rate": rate, "eta": eta})
    return runs, total


def _pace(finished: int, total: int, started: str | None) -> tuple[float | None, float | None]:
    """(tasks finished per second since the run started, seconds left at that pace) of a running run."""
    try:
        since = dt.datetime.fromisoformat(started) if started else None
    except ValueError:
        since = None
    if since is None or not finished:
        return None, None
    if since.tzinfo is None:
        since = since.replace(tzinfo=dt.UTC)
    elapsed = (dt.datetime.now(dt.UTC) - since).total_seconds()
    if elapsed <= 0:
        return None, None
    rate = finished / elapsed
    return round(rate, 3), round(max(0, total - finished) / rate, 1)


async def runs_json(request: web.Request) -> web.Response:
    f = _run_filter(request)
    runs, total = _runs(request, f)
    return web.json_response({"runs": runs, "total": total, "limit": f.limit, "offset": f.offset})


async def runs_page(request: web.Request) -> web.Response:
    f = _run_filter(request)
    runs, total = _runs(request, f)
    return _page(request, "runs.html", title="Runs", runs=runs, total=total, f=f, sorts=list(RUN_SORTS),
                 statuses=request.app[READS].statuses(), pages=_pages(request, f.limit, f.offset, total))


def _pages(request: web.Request, limit: int, offset: int, total: int) -> dict[str, Any]:
    """Links to the previous and next pages (the query with another offset)."""
    def link(to: int) -> str:
        return str(request.rel_url.update_query(offset=str(to)))

    return {"first": offset + 1 if total else 0, "last": min(offset + limit, total), "total": total,
            "previous": link(max(0, offset - limit)) if offset > 0 else None,
            "next": link(offset + limit) if offset + limit < total else None}


# -- a run -----------------------------------------------------------------------------------------------
async def run_page(request: web.Request) -> web.Response:
    store = request.app[STORE]
    run = store.get_run(request.match_info["run"])
    report = html_report.render(html_report.build(store, run["id"], max_samples=RUN_PAGE_SAMPLES))
    body = report.split("<body>", 1)[1].rsplit("</body>", 1)[0]  # the report's own (escaped) rendering
    as_models = [m for value in request.query.getall("as", []) for m in value.replace(",", " ").split()]
    batch, cached = request.query.get("batch") == "1", request.query.get("cached") == "1"
    priced = None
    if as_models or batch or cached:  # `runner costs RUN --as MODEL --batch --cached`, as it prints it
        priced = whatif.render(whatif.build(store, run["id"], as_models=as_models, batch=batch, cached=cached),
                               "text")
    return _page(request, "run.html", title=f"Run {run['id']}", run=run, report=Markup(body),
                 report_css=Markup(html_report.CSS), as_models=as_models, batch=batch, cached=cached,
                 whatif=priced)


async def explain_json(request: web.Request) -> web.Response:
    """``runner explain RUN --item ITEM --stage STAGE``'s answer, as data and as its text; ``key=`` keeps only
    that request (one answer's)."""
    run = request.app[STORE].get_run(request.match_info["run"])
    item, stage = request.query.get("item", "").strip(), request.query.get("stage", "").strip() or None
    if not item:
        raise RunnerError("?item= names the item to explain (a dataset row's id)")
    data = explanations.build(request.app[STORE], item, run_id=run["id"], stage=stage)
    key = request.query.get("key", "").strip()
    if key:
        data["requests"] = [r for r in data["requests"] if r["key"] == key]
    return web.json_response({**data, "text": explanations.render(data, "text")})


# -- answers ---------------------------------------------------------------------------------------------
def _answer_filter(request: web.Request) -> AnswerFilter:
    q = request.query
    outcome = q.get("outcome", "")
    if outcome and outcome not in ANSWER_OUTCOMES:
        raise RunnerError(f"?outcome= is one of {', '.join(ANSWER_OUTCOMES)}, not {outcome!r}")
    return AnswerFilter(text=q.get("q", "").strip(), stage=q.get("stage", ""), model=q.get("model", ""),
                        outcome=outcome, error_class=q.get("error_class", ""), row=q.get("row", ""),
                        limit=_int(request, "limit", PAGE_SIZE, MAX_PAGE), offset=_int(request, "offset", 0))


async def answers_json(request: web.Request) -> web.Response:
    run = request.app[STORE].get_run(request.match_info["run"])
    f = _answer_filter(request)
    answers, total = request.app[READS].answers(run["id"], f)
    return web.json_response({"answers": answers, "total": total, "limit": f.limit, "offset": f.offset})


async def answers_page(request: web.Request) -> web.Response:
    run = request.app[STORE].get_run(request.match_info["run"])
    f = _answer_filter(request)
    reads = request.app[READS]
    answers, total = reads.answers(run["id"], f)
    for answer in answers:
        answer["messages"] = _messages(answer["request"])
        answer["outcome"] = html_report.outcome(answer["result"])
        answer["parsed"] = _text(answer["result"].get("parsed"))
        answer["answer"] = _text(answer["result"].get("response"))
        answer["options"] = html_report.shown_options({**answer["result"], "_request": answer["request"]})
    return _page(request, "answers.html", title=f"Answers of run {run['id']}", run=run, answers=answers, f=f,
                 facets=reads.facets(run["id"]), outcomes=ANSWER_OUTCOMES,
                 pages=_pages(request, f.limit, f.offset, total))


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _messages(request: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(role, text) of the prompt as sent: the memo's messages, a log-likelihood call's pairs, else its JSON."""
    if request is None:
        return []
    if "messages" in request:
        return [(str(m.get("role")), m["content"] if isinstance(m.get("content"), str)
                 else json.dumps(m.get("content"), ensure_ascii=False, indent=1)) for m in request["messages"]]
    if "pairs" in request:
        return [(f"option {i}", f"{context}{continuation}") for i, (context, continuation) in
                enumerate(request["pairs"])]
    return [("request", json.dumps(request, ensure_ascii=False, indent=1))]


# -- compare ---------------------------------------------------------------------------------------------
async def compare_page(request: web.Request) -> web.Response:
    """``?a=&b=`` (with ``model_a``/``model_b``) compares two sides; ``?run=A&run=B&run=C`` (optionally with one
    ``model`` for all or one per run) or ``?run=A&model=X&model=Y&model=Z`` compares each side with the first."""
    q = request.query
    a, b = q.get("a", "").strip(), q.get("b", "").strip()
    model_a, model_b = q.get("model_a", "").strip(), q.get("model_b", "").strip()
    context: dict[str, Any] = {"title": "Compare", "a": a, "b": b, "model_a": model_a, "model_b": model_b,
                               "note": comparisons.METHOD_NOTE, "sides": [], "pairs": [], "groups": []}
    pairs = _compare_pairs(request)
    if not a and not pairs:
        return _page(request, "compare.html", **context)
    if a:
        pairs = [(a, b or None, (model_a, model_b) if model_a and model_b else None)]
    store = request.app[STORE]
    built = [comparisons.build(store, run_a, run_b, models=models) for run_a, run_b, models in pairs]
    context["pairs"] = [{"title": comparisons.title(data), "headers": comparisons.headers(data),
                         "table": comparisons.table_rows(data)} for data in built]
    context["groups"] = _disagreements(store, built)
    return _page(request, "compare.html", **context)


def _compare_pairs(request: web.Request) -> list[tuple[str, str | None, tuple[str, str] | None]]:
    """(baseline run, other run, (baseline model, other model)) per side compared with the first."""
    runs = [r.strip() for r in request.query.getall("run", []) if r.strip()]
    models = [m.strip() for m in request.query.getall("model", []) if m.strip()]
    if not runs:
        if models:
            raise RunnerError("?model= needs a ?run= to compare its models in")
        return []
    if len(runs) == 1:
        if len(models) < 2:
            raise RunnerError("one ?run= compares two or more models: add ?model=X&model=Y, or add another ?run=")
        return [(runs[0], None, (models[0], m)) for m in models[1:]]
    if len(models) > 1 and len(models) != len(runs):
        raise RunnerError(f"?model= is given once (the same model in every run) or once per ?run= ({len(runs)}), "
                          f"not {len(models)} times")
    if len(models) == 1:
        models = models * len(runs)
    return [(runs[0], run, (models[0], models[i + 1]) if models else None) for i, run in enumerate(runs[1:])]


def _disagreements(store: Store, built: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per baseline (stage, run, model): the items scored on the baseline where any compared side scored them
    differently, each with every side's score (None where a side did not score it); up to MAX_DISAGREEMENTS items
    in all."""
    loaded: dict[tuple[str, str], Any] = {}

    def means(run: str, stage: str, model: str) -> dict[str, float]:
        if (run, stage) not in loaded:
            loaded[run, stage] = stage_items(store, run, stage)
        items = loaded[run, stage].scores.get(model)
        return items.means() if items else {}

    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for data in built:
        for row in data["rows"]:
            key = (row["stage"], row["run_a"], row["model_a"])
            group = groups.setdefault(key, {"stage": row["stage"], "run": row["run_a"], "model": row["model_a"],
                                            "scores": means(row["run_a"], row["stage"], row["model_a"]), "sides": []})
            side = {"run": row["run_b"], "model": row["model_b"]}
            if side not in [{"run": s["run"], "model": s["model"]} for s in group["sides"]]:
                group["sides"].append({**side, "scores": means(row["run_b"], row["stage"], row["model_b"])})
    out, left = [], MAX_DISAGREEMENTS
    for group in groups.values():
        differ = [item for item in sorted(group["scores"], key=_item_order)
                  if any(item in s["scores"] and s["scores"][item] != group["scores"][item] for s in group["sides"])]
        group["items"] = [{"item": item, "score": group["scores"][item],
                           "sides": [s["scores"].get(item) for s in group["sides"]]} for item in differ[:left]]
        left -= len(group["items"])
        out.append(group)
    return out


def _item_order(item: str) -> tuple[int, int, str]:
    """Row numbers in numeric order, then other ids as text."""
    return (0, int(item), "") if item.isdigit() else (1, 0, item)


# -- costs -----------------------------------------------------------------------------------------------
async def costs_page(request: web.Request) -> web.Response:
    store = request.app[STORE]
    since = spend.parse_since(request.query.get("since") or None)
    tables = []
    for by in spend.BY:
        data = spend.build(store, by=by, since=since)
        savings = request.app[READS].savings(by, since)
        for row in data["rows"]:
            row["batch_saved"], row["cache_saved"] = savings.get(str(row[by]), (0.0, 0.0))
        for name in ("batch_saved", "cache_saved"):
            data["totals"][name] = sum(row[name] for row in data["rows"])
        tables.append({"by": by, "data": data})
    return _page(request, "costs.html", title="Costs", tables=tables, since=since or "")
