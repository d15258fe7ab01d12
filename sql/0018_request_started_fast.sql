-- tg_request_started (0009) without the bounded repetitions: the same answer for every
-- text, three times cheaper (issue #18, item 6).
--
-- Postgres's regex engine runs '^[0-9a-f]{12}-[0-9a-f]{18}$' at ~3 µs a call, and the
-- function is called for every usage row: by the partitions' CHECK (started_at =
-- tg_request_started(request_id)) on each insert — half the CPU of inserting a usage row
-- —, by the settlement batch and its rollup (several times a row) and by the
-- reconciler. A 12 hex + '-' + 18 hex id is exactly a text of 31 bytes whose 13th
-- character is '-' and that is hex digits, one '-', hex digits: three checks, the last
-- an unbounded regex (~1 µs). Same value, so the CHECK holds for every existing row.
CREATE OR REPLACE FUNCTION tg_request_started(rid text) RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(rid) = 31 AND substr(rid, 13, 1) = '-' AND rid ~ '^[0-9a-f]+-[0-9a-f]+$'
                THEN to_timestamp(('x' || lpad(left(rid, 12), 16, '0'))::bit(64)::bigint / 1000.0)
                ELSE '-infinity'::timestamptz END
$$;
