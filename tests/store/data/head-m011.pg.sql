--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: __SCHEMA__; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA __SCHEMA__;


--
-- Name: ledger_use(); Type: FUNCTION; Schema: __SCHEMA__; Owner: -
--

CREATE FUNCTION __SCHEMA__.ledger_use() RETURNS trigger
    LANGUAGE plpgsql
    AS $$ BEGIN IF TG_OP IN ('DELETE', 'UPDATE') THEN IF OLD.kind IN ('reserved', 'charge', 'possibly_billed') THEN INSERT INTO budget_use (run_id, scope, usd, inflight) VALUES (OLD.run_id, 'run', -OLD.amount, -(OLD.kind = 'reserved')::int), (OLD.run_id, 'stage:' || OLD.stage, -OLD.amount, -(OLD.kind = 'reserved')::int), (OLD.run_id, 'model:' || OLD.model, -OLD.amount, -(OLD.kind = 'reserved')::int) ON CONFLICT (run_id, scope) DO UPDATE SET usd = budget_use.usd + excluded.usd, inflight = budget_use.inflight + excluded.inflight; END IF; END IF; IF TG_OP IN ('INSERT', 'UPDATE') THEN IF NEW.kind IN ('reserved', 'charge', 'possibly_billed') THEN INSERT INTO budget_use (run_id, scope, usd, inflight) VALUES (NEW.run_id, 'run', NEW.amount, (NEW.kind = 'reserved')::int), (NEW.run_id, 'stage:' || NEW.stage, NEW.amount, (NEW.kind = 'reserved')::int), (NEW.run_id, 'model:' || NEW.model, NEW.amount, (NEW.kind = 'reserved')::int) ON CONFLICT (run_id, scope) DO UPDATE SET usd = budget_use.usd + excluded.usd, inflight = budget_use.inflight + excluded.inflight; END IF; END IF; RETURN NULL; END $$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: _migrations; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__._migrations (
    name text NOT NULL,
    applied_at text
);


--
-- Name: batch_lines; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.batch_lines (
    batch_id text NOT NULL,
    key text NOT NULL,
    ledger_id bigint,
    status text DEFAULT 'pending'::text NOT NULL
);


--
-- Name: batches; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.batches (
    id text NOT NULL,
    run_id text,
    stage text,
    model text,
    provider_batch_id text,
    round bigint,
    state text,
    provider_state text,
    lines bigint,
    created text,
    updated text
);


--
-- Name: budget_use; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.budget_use (
    run_id text NOT NULL,
    scope text NOT NULL,
    usd double precision DEFAULT 0 NOT NULL,
    inflight bigint DEFAULT 0 NOT NULL
);


--
-- Name: claims; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.claims (
    key text NOT NULL,
    worker text NOT NULL,
    expires double precision NOT NULL
);


--
-- Name: leases; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.leases (
    run_id text NOT NULL,
    stage text NOT NULL,
    chunk bigint NOT NULL,
    worker text NOT NULL,
    expires double precision NOT NULL,
    done bigint DEFAULT 0 NOT NULL,
    token bigint DEFAULT 1 NOT NULL
);


--
-- Name: ledger; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.ledger (
    id bigint NOT NULL,
    run_id text,
    stage text,
    model text,
    key text,
    kind text,
    amount double precision,
    created text,
    worker text
);


--
-- Name: ledger_id_seq; Type: SEQUENCE; Schema: __SCHEMA__; Owner: -
--

CREATE SEQUENCE __SCHEMA__.ledger_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: ledger_id_seq; Type: SEQUENCE OWNED BY; Schema: __SCHEMA__; Owner: -
--

ALTER SEQUENCE __SCHEMA__.ledger_id_seq OWNED BY __SCHEMA__.ledger.id;


--
-- Name: responses; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.responses (
    key text NOT NULL,
    provider text,
    model text,
    request_json text,
    response_text text,
    response_json text,
    finish_reason text,
    input_tokens bigint,
    output_tokens bigint,
    cached_tokens bigint,
    cost double precision,
    latency double precision,
    created text,
    thinking text,
    reasoning_tokens bigint
);


--
-- Name: run_stages; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.run_stages (
    run_id text NOT NULL,
    stage text NOT NULL,
    "position" bigint NOT NULL,
    hash text NOT NULL,
    funnel text NOT NULL
);


--
-- Name: runs; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.runs (
    id text NOT NULL,
    job_name text,
    job_path text,
    job_json text,
    fingerprint text,
    status text,
    total bigint,
    pid bigint,
    message text,
    created text,
    started text,
    finished text,
    deadline text
);


--
-- Name: stage_outputs; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.stage_outputs (
    hash text NOT NULL,
    stage text,
    run_id text,
    rows bigint,
    cost double precision,
    funnel text,
    created text
);


--
-- Name: stage_replays; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.stage_replays (
    hash text NOT NULL,
    run_id text,
    stage text,
    tasks bigint,
    created text
);


--
-- Name: stage_rows; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.stage_rows (
    hash text NOT NULL,
    n bigint NOT NULL,
    "row" text NOT NULL
);


--
-- Name: tasks; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.tasks (
    run_id text NOT NULL,
    stage text NOT NULL,
    item text NOT NULL,
    model text,
    row_id text,
    variant_json text,
    key text,
    status text,
    cache_hit bigint,
    attempts bigint,
    error_class text,
    error text,
    input_tokens bigint,
    output_tokens bigint,
    cost double precision,
    latency double precision,
    score double precision,
    valid bigint,
    result_json text,
    updated text,
    seq bigint NOT NULL,
    cached_tokens bigint,
    saved double precision,
    batch_saved double precision
);


--
-- Name: tasks_seq_seq; Type: SEQUENCE; Schema: __SCHEMA__; Owner: -
--

CREATE SEQUENCE __SCHEMA__.tasks_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: tasks_seq_seq; Type: SEQUENCE OWNED BY; Schema: __SCHEMA__; Owner: -
--

ALTER SEQUENCE __SCHEMA__.tasks_seq_seq OWNED BY __SCHEMA__.tasks.seq;


--
-- Name: workers; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.workers (
    id text NOT NULL,
    run_id text NOT NULL,
    host text,
    pid bigint,
    started text,
    seen double precision NOT NULL,
    state text DEFAULT 'live'::text NOT NULL
);


--
-- Name: ledger id; Type: DEFAULT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.ledger ALTER COLUMN id SET DEFAULT nextval('__SCHEMA__.ledger_id_seq'::regclass);


--
-- Name: tasks seq; Type: DEFAULT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.tasks ALTER COLUMN seq SET DEFAULT nextval('__SCHEMA__.tasks_seq_seq'::regclass);


--
-- Data for Name: _migrations; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__._migrations VALUES ('m001_responses', '2026-11-25T21:30:43.897456+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m002_runs', '2026-11-25T21:30:43.901347+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m003_tasks', '2026-11-25T21:30:43.939260+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m004_ledger', '2026-11-25T21:30:43.945898+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m005_costs', '2026-11-25T21:30:43.971237+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m006_pipelines', '2026-11-25T21:30:43.990354+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m007_stage_replays', '2026-11-25T21:30:44.013230+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m008_batches', '2026-11-25T21:30:44.041828+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m009_workers', '2026-11-25T21:30:44.111272+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m010_thinking', '2026-11-25T21:30:44.111993+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m011_fencing', '2026-11-25T21:30:44.112279+00:00');


--
-- Data for Name: batch_lines; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.batch_lines VALUES ('b1', 'k4', NULL, 'pending');


--
-- Data for Name: batches; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.batches VALUES ('b1', '20240101-000000-aaaa', 'mc', 'sim:m', 'pb1', 1, 'running', 'submitted', 1, '2026-11-25T21:30:44.185+00:00', '2026-11-25T21:30:44.185+00:00');


--
-- Data for Name: budget_use; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.budget_use VALUES ('20240101-000000-aaaa', 'run', 1, 1);
INSERT INTO __SCHEMA__.budget_use VALUES ('20240101-000000-aaaa', 'stage:mc', 1, 1);
INSERT INTO __SCHEMA__.budget_use VALUES ('20240101-000000-aaaa', 'model:sim:m', 1, 1);


--
-- Data for Name: claims; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: leases; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.leases VALUES ('20240101-000000-aaaa', 'mc', 0, 'w1', 1795642274.180536, 0, 1);
INSERT INTO __SCHEMA__.leases VALUES ('20240101-000000-aaaa', 'mc', 1, 'w1', 1795642274.180755, 0, 1);


--
-- Data for Name: ledger; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.ledger VALUES (1, '20240101-000000-aaaa', 'mc', 'sim:m', 'k1', 'charge', 0.25, '2024-01-01T00:00:00', NULL);
INSERT INTO __SCHEMA__.ledger VALUES (2, '20240101-000000-aaaa', 'mc', 'sim:m', 'k2', 'charge', 0.25, '2024-01-01T00:00:00', NULL);
INSERT INTO __SCHEMA__.ledger VALUES (3, '20240101-000000-aaaa', 'mc', 'sim:m', 'k3', 'reserved', 0.5, '2026-11-25T21:30:44.159+00:00', 'w1');


--
-- Data for Name: responses; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.responses VALUES ('k1', 'sim', 'm', '{}', 'A', '{}', 'stop', 10, 2, 0, 0.25, 0.1, '2024-01-01T00:00:00', 'thought', 3);
INSERT INTO __SCHEMA__.responses VALUES ('k2', 'sim', 'm', '{}', 'A', '{}', 'stop', 10, 2, 0, 0.25, 0.1, '2024-01-01T00:00:00', 'thought', 3);


--
-- Data for Name: run_stages; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.run_stages VALUES ('20240101-000000-aaaa', 'mc', 0, 'h1', '{"stage":"mc","rows":1}');


--
-- Data for Name: runs; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.runs VALUES ('20240101-000000-aaaa', 'job', 'job.yaml', '{"name":"job"}', 'fp', 'running', 3, 28747, NULL, '2024-01-01T00:00:00', '2026-11-25T21:30:44.116+00:00', NULL, NULL);


--
-- Data for Name: stage_outputs; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_outputs VALUES ('h1', 'mc', '20240101-000000-aaaa', 1, 0.5, '{"stage":"mc","rows":1}', '2026-11-25T21:30:44.207+00:00');


--
-- Data for Name: stage_replays; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_replays VALUES ('h2', '20240101-000000-aaaa', 'mc', 2, '2026-11-25T21:30:44.214+00:00');


--
-- Data for Name: stage_rows; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_rows VALUES ('h1', 0, '{"a":1}');


--
-- Data for Name: tasks; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.tasks VALUES ('20240101-000000-aaaa', 'mc', 'i1', 'sim:m', 'i1', '{"seed":1}', 'k1', 'done', 0, 1, NULL, NULL, 10, 2, 0.25, 0.1, 1, 1, '{"item": "i1", "gold": "A"}', '2026-11-25T21:30:44.139Z', 1, 0, 0, NULL);
INSERT INTO __SCHEMA__.tasks VALUES ('20240101-000000-aaaa', 'mc', 'i2', 'sim:m', 'i2', '{"seed":1}', 'k2', 'done', 0, 1, NULL, NULL, 10, 2, 0.25, 0.1, 1, 1, '{"item": "i2", "gold": "A"}', '2026-11-25T21:30:44.139Z', 2, 0, 0, NULL);


--
-- Data for Name: workers; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.workers VALUES ('w1', '20240101-000000-aaaa', 'host', 1, '2026-11-25T21:30:44.171+00:00', 1795642274.175644, 'live');


--
-- Name: ledger_id_seq; Type: SEQUENCE SET; Schema: __SCHEMA__; Owner: -
--

SELECT pg_catalog.setval('__SCHEMA__.ledger_id_seq', 3, true);


--
-- Name: tasks_seq_seq; Type: SEQUENCE SET; Schema: __SCHEMA__; Owner: -
--

SELECT pg_catalog.setval('__SCHEMA__.tasks_seq_seq', 2, true);


--
-- Name: _migrations _migrations_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__._migrations
    ADD CONSTRAINT _migrations_pkey PRIMARY KEY (name);


--
-- Name: batch_lines batch_lines_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.batch_lines
    ADD CONSTRAINT batch_lines_pkey PRIMARY KEY (batch_id, key);


--
-- Name: batches batches_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.batches
    ADD CONSTRAINT batches_pkey PRIMARY KEY (id);


--
-- Name: budget_use budget_use_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.budget_use
    ADD CONSTRAINT budget_use_pkey PRIMARY KEY (run_id, scope);


--
-- Name: claims claims_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.claims
    ADD CONSTRAINT claims_pkey PRIMARY KEY (key);


--
-- Name: leases leases_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (run_id, stage, chunk);


--
-- Name: ledger ledger_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.ledger
    ADD CONSTRAINT ledger_pkey PRIMARY KEY (id);


--
-- Name: responses responses_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.responses
    ADD CONSTRAINT responses_pkey PRIMARY KEY (key);


--
-- Name: run_stages run_stages_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.run_stages
    ADD CONSTRAINT run_stages_pkey PRIMARY KEY (run_id, stage);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);


--
-- Name: stage_outputs stage_outputs_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.stage_outputs
    ADD CONSTRAINT stage_outputs_pkey PRIMARY KEY (hash);


--
-- Name: stage_replays stage_replays_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.stage_replays
    ADD CONSTRAINT stage_replays_pkey PRIMARY KEY (hash);


--
-- Name: stage_rows stage_rows_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.stage_rows
    ADD CONSTRAINT stage_rows_pkey PRIMARY KEY (hash, n);


--
-- Name: tasks tasks_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (run_id, stage, item);


--
-- Name: workers workers_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);


--
-- Name: batch_lines_key; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX batch_lines_key ON __SCHEMA__.batch_lines USING btree (key);


--
-- Name: claims_worker; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX claims_worker ON __SCHEMA__.claims USING btree (worker);


--
-- Name: idx_batches_run_id_stage_state; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idx_batches_run_id_stage_state ON __SCHEMA__.batches USING btree (run_id, stage, state);


--
-- Name: idx_ledger_run_id; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idx_ledger_run_id ON __SCHEMA__.ledger USING btree (run_id);


--
-- Name: idx_ledger_run_id_kind; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idx_ledger_run_id_kind ON __SCHEMA__.ledger USING btree (run_id, kind);


--
-- Name: idx_tasks_run_id_stage_model; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idx_tasks_run_id_stage_model ON __SCHEMA__.tasks USING btree (run_id, stage, model);


--
-- Name: leases_worker; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX leases_worker ON __SCHEMA__.leases USING btree (worker);


--
-- Name: workers_run; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX workers_run ON __SCHEMA__.workers USING btree (run_id);


--
-- Name: ledger ledger_use_delete; Type: TRIGGER; Schema: __SCHEMA__; Owner: -
--

CREATE TRIGGER ledger_use_delete AFTER DELETE ON __SCHEMA__.ledger FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.ledger_use();


--
-- Name: ledger ledger_use_insert; Type: TRIGGER; Schema: __SCHEMA__; Owner: -
--

CREATE TRIGGER ledger_use_insert AFTER INSERT ON __SCHEMA__.ledger FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.ledger_use();


--
-- Name: ledger ledger_use_update; Type: TRIGGER; Schema: __SCHEMA__; Owner: -
--

CREATE TRIGGER ledger_use_update AFTER UPDATE OF kind, amount ON __SCHEMA__.ledger FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.ledger_use();


--
-- PostgreSQL database dump complete
--


