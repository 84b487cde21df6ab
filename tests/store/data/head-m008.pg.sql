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
    created text
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
    created text
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

INSERT INTO __SCHEMA__._migrations VALUES ('m001_responses', '2026-11-25T21:30:42.895319+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m002_runs', '2026-11-25T21:30:42.897605+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m003_tasks', '2026-11-25T21:30:42.903964+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m004_ledger', '2026-11-25T21:30:42.911784+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m005_costs', '2026-11-25T21:30:42.912753+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m006_pipelines', '2026-11-25T21:30:42.920502+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m007_stage_replays', '2026-11-25T21:30:42.921870+00:00');
INSERT INTO __SCHEMA__._migrations VALUES ('m008_batches', '2026-11-25T21:30:42.932014+00:00');


--
-- Data for Name: batch_lines; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: batches; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: ledger; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.ledger VALUES (1, '20240101-000000-aaaa', 'mc', 'sim:m', 'k1', 'charge', 0.25, '2024-01-01T00:00:00');
INSERT INTO __SCHEMA__.ledger VALUES (2, '20240101-000000-aaaa', 'mc', 'sim:m', 'k3', 'reserved', 0.5, '2024-01-01T00:00:00');


--
-- Data for Name: responses; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.responses VALUES ('k1', 'sim', 'm', '{}', 'A', '{}', 'stop', 10, 2, 0, 0.25, 0.1, '2024-01-01T00:00:00');


--
-- Data for Name: run_stages; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.run_stages VALUES ('20240101-000000-aaaa', 'mc', 0, 'h1', '{"stage":"mc","rows":1}');


--
-- Data for Name: runs; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.runs VALUES ('20240101-000000-aaaa', 'job', 'job.yaml', '{"name":"job"}', 'fp', 'running', 3, 28747, NULL, '2024-01-01T00:00:00', '2026-11-25T21:30:42.933+00:00', NULL, NULL);


--
-- Data for Name: stage_outputs; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_outputs VALUES ('h1', 'mc', '20240101-000000-aaaa', 1, 0.5, '{"stage":"mc","rows":1}', '2026-11-25T21:30:42.944+00:00');


--
-- Data for Name: stage_replays; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_replays VALUES ('h2', '20240101-000000-aaaa', 'mc', 2, '2026-11-25T21:30:42.947+00:00');


--
-- Data for Name: stage_rows; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.stage_rows VALUES ('h1', 0, '{"a":1}');


--
-- Data for Name: tasks; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.tasks VALUES ('20240101-000000-aaaa', 'mc', 'i1', 'sim:m', 'i1', '{"seed":1}', 'k1', 'done', 0, 1, NULL, NULL, 10, 2, 0.25, 0.1, 1, 1, '{"item": "i1", "gold": "A"}', '2024-01-01T00:00:00', 1, 0, 0, NULL);


--
-- Name: ledger_id_seq; Type: SEQUENCE SET; Schema: __SCHEMA__; Owner: -
--

SELECT pg_catalog.setval('__SCHEMA__.ledger_id_seq', 2, true);


--
-- Name: tasks_seq_seq; Type: SEQUENCE SET; Schema: __SCHEMA__; Owner: -
--

SELECT pg_catalog.setval('__SCHEMA__.tasks_seq_seq', 1, true);


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
-- Name: batch_lines_key; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX batch_lines_key ON __SCHEMA__.batch_lines USING btree (key);


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
-- PostgreSQL database dump complete
--


