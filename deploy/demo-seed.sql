-- The demo rows of docker-compose.yml's `seed` service (psql in the PostgreSQL container),
-- written as an application writes them: plain INSERTs into the outbox table, in one
-- transaction (an application commits them with its own changes). The table's insert
-- trigger wakes the relay at once.
--
-- Ordered rows (three of order-1001), a row the demo receiver refuses once with 503
-- ("demo": "flaky": retried), a row it refuses for good with 410 ("demo": "fail": FAILED;
-- try `outbox-relay failed` and `outbox-relay requeue --id N`), and a row for the log sink.
-- On a fresh database they get the ids 1 to 7; the 410 row is 6.
\set ON_ERROR_STOP on
BEGIN;
INSERT INTO outbox (channel, ordering_key, payload)
  VALUES ('demo', 'order-1001', '{"type":"order.created","order":1001}');
INSERT INTO outbox (channel, ordering_key, payload)
  VALUES ('demo', 'order-1001', '{"type":"order.paid","order":1001}');
INSERT INTO outbox (channel, ordering_key, payload)
  VALUES ('demo', 'order-1001', '{"type":"order.shipped","order":1001}');
INSERT INTO outbox (channel, payload) VALUES ('demo', '{"type":"order.created","order":1002}');
INSERT INTO outbox (channel, payload)
  VALUES ('demo', '{"type":"order.created","order":1003,"demo":"flaky"}');
INSERT INTO outbox (channel, payload)
  VALUES ('demo', '{"type":"order.created","order":1004,"demo":"fail"}');
INSERT INTO outbox (channel, payload) VALUES ('log', '{"hello":"from the log sink"}');
COMMIT;
