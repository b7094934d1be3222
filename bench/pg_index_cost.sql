-- What PostgreSQL's full-text index costs a write, server side, with no client in the
-- way: 20,000 chat messages (JSON of about 200 and 800 bytes, words drawn from a
-- 2,000-word vocabulary) inserted two a statement, as an agent turn writes them, into
-- tables that differ only in their index.
--
--   psql -q -h 127.0.0.1 -U postgres -d DB -f bench/pg_index_cost.sql
--
-- It makes and drops its own tables (names starting `cost_`).
\timing off
SELECT setseed(0.42);
CREATE TEMP TABLE cost_words AS
    SELECT g AS n, translate(substr(md5(g::text), 1, 3 + g % 7), '0123456789', 'ghijklmnop') AS w FROM generate_series(0, 1999) g;
CREATE TEMP TABLE cost_src AS
    SELECT g AS id,
           json_build_object('role', CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END,
                             'content', (SELECT string_agg(w, ' ') FROM cost_words
                                         WHERE n IN (SELECT (random() * 1999)::int + g * 0
                                                     FROM generate_series(1, CASE WHEN g % 2 = 0 THEN 30 ELSE 120 END))))::text AS data
    FROM generate_series(0, 19999) g;
ALTER TABLE cost_src ADD PRIMARY KEY (id);
CREATE TABLE cost_none (id bigint PRIMARY KEY, data text, search_text text);
CREATE TABLE cost_gin (id bigint PRIMARY KEY, data text, search_text text);
-- histstore's index expression (revision 5b7e2d4a9c13)
CREATE INDEX ON cost_gin USING gin (to_tsvector('simple'::regconfig, nullif(coalesce(search_text, CASE WHEN strpos(data, '\u0000') > 0 THEN NULL WHEN json_typeof((data::json)->'content') = 'string' THEN (data::json)->>'content' END), '')));
CREATE TABLE cost_gin_plain (id bigint PRIMARY KEY, data text, search_text text);
CREATE INDEX ON cost_gin_plain USING gin (to_tsvector('simple'::regconfig, data));
CREATE TABLE cost_gin_pending (id bigint PRIMARY KEY, data text, search_text text);
CREATE INDEX cost_gin_pending_ix ON cost_gin_pending USING gin (to_tsvector('simple'::regconfig, nullif(coalesce(search_text, CASE WHEN strpos(data, '\u0000') > 0 THEN NULL WHEN json_typeof((data::json)->'content') = 'string' THEN (data::json)->>'content' END), ''))) WITH (gin_pending_list_limit = 2097151);
CREATE TABLE cost_gin_direct (id bigint PRIMARY KEY, data text, search_text text);
CREATE INDEX ON cost_gin_direct USING gin (to_tsvector('simple'::regconfig, nullif(coalesce(search_text, CASE WHEN strpos(data, '\u0000') > 0 THEN NULL WHEN json_typeof((data::json)->'content') = 'string' THEN (data::json)->>'content' END), ''))) WITH (fastupdate = off);
\echo 'each line: 10,000 statements of two rows'
\timing on
\echo 'no index'
DO $$ BEGIN FOR i IN 0..9999 LOOP INSERT INTO cost_none SELECT id, data FROM cost_src WHERE id IN (2*i, 2*i+1); END LOOP; END $$;
\echo 'GIN on histstore''s expression (the default pending list, 4 MB)'
DO $$ BEGIN FOR i IN 0..9999 LOOP INSERT INTO cost_gin SELECT id, data FROM cost_src WHERE id IN (2*i, 2*i+1); END LOOP; END $$;
\echo 'GIN on to_tsvector of the stored text itself (no JSON parsed)'
DO $$ BEGIN FOR i IN 0..9999 LOOP INSERT INTO cost_gin_plain SELECT id, data FROM cost_src WHERE id IN (2*i, 2*i+1); END LOOP; END $$;
\echo 'GIN with a 2 GB pending list (then the pending list merged)'
DO $$ BEGIN FOR i IN 0..9999 LOOP INSERT INTO cost_gin_pending SELECT id, data FROM cost_src WHERE id IN (2*i, 2*i+1); END LOOP; END $$;
SELECT gin_clean_pending_list('cost_gin_pending_ix') IS NOT NULL AS merged;
\echo 'GIN without a pending list (fastupdate off)'
DO $$ BEGIN FOR i IN 0..9999 LOOP INSERT INTO cost_gin_direct SELECT id, data FROM cost_src WHERE id IN (2*i, 2*i+1); END LOOP; END $$;
\echo 'to_tsvector alone, over the 20,000 messages'
SELECT count(to_tsvector('simple'::regconfig, (data::json)->>'content')) FROM cost_src;
\timing off
DROP TABLE cost_none, cost_gin, cost_gin_plain, cost_gin_pending, cost_gin_direct;
