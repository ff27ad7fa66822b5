package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/outbox"
)

// fillChunk is how many orders one statement of fill writes: 100,000
// outbox rows, as many inbox rows, and 40,000 transitions.
const fillChunk = 20_000

// layoutSQL makes a new database's message_outbox and message_inbox start
// weeks weekly time partitions ago, as if the relays and consumers had made
// them since: the partitions the migrations made (empty) are dropped, the
// initial one ends where the history starts, and weeks follow up to the
// horizon. $1 is where the history starts.
const layoutSQL = `
DO $$
DECLARE
    n text;
BEGIN
    FOR n IN SELECT partition_name FROM outbox_time_partition_bounds() LOOP
        EXECUTE format('DROP TABLE %I', n);
    END LOOP;
    FOR n IN SELECT partition_name FROM inbox_time_partition_bounds() LOOP
        EXECUTE format('DROP TABLE %I', n);
    END LOOP;
    EXECUTE format('CREATE TABLE message_outbox_initial PARTITION OF message_outbox FOR VALUES FROM (MINVALUE) TO (%L)',
        current_setting('bench_volume.start'));
    EXECUTE format('CREATE TABLE message_inbox_initial PARTITION OF message_inbox FOR VALUES FROM (MINVALUE) TO (%L)',
        current_setting('bench_volume.start'));
END
$$`

// fillSQL writes orders $1 to $2-1 of $5, spread evenly from $3 to $4:
// each order with two transitions (created, fulfilled), five outbox rows
// published 20 ms after they were written, and each of those processed by
// one of three consumers 50 ms after. Ids are made from the order's number
// (md5), so that the timeline step can name an order.
const fillSQL = `
WITH o AS (
    INSERT INTO orders (order_id, customer_id, currency, status, total_cents, created_at, updated_at)
    SELECT md5('volume' || g)::uuid, 'customer-' || (g % 5000), 'EUR', 'FULFILLED', 1000 + g % 9000, x.t, x.t + interval '2 seconds'
    FROM generate_series($1::bigint, $2::bigint - 1) AS g,
         LATERAL (SELECT $3::timestamptz + ($4::timestamptz - $3::timestamptz) * (g::float8 / $5::float8) AS t) AS x
    RETURNING order_id, created_at
), t AS (
    INSERT INTO order_state_transition (order_id, from_status, to_status, created_at)
    SELECT o.order_id, s.from_status, s.to_status, o.created_at + s.after
    FROM o, (VALUES (NULL, 'SUBMITTED', interval '0'), ('SUBMITTED', 'FULFILLED', interval '2 seconds')) AS s (from_status, to_status, after)
), m AS (
    INSERT INTO message_outbox (outbox_id, aggregate_type, aggregate_id, message_type, message_version, exchange_name,
                                routing_key, payload, status, attempt_count, next_attempt_at, published_at, created_at, updated_at)
    SELECT md5(o.order_id::text || k)::uuid, 'order', o.order_id::text, 'order.volume' || k, 1, 'orders',
           'order.volume' || k, jsonb_build_object('order_id', o.order_id, 'step', k), 'PUBLISHED', 1,
           o.created_at + k * interval '100 ms', o.created_at + k * interval '100 ms' + interval '20 ms',
           o.created_at + k * interval '100 ms', o.created_at + k * interval '100 ms' + interval '20 ms'
    FROM o, generate_series(1, 5) AS k
    RETURNING outbox_id, aggregate_id, message_type, created_at
)
INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, aggregate_id, status, outcome,
                           attempt_count, payload_hash, first_received_at, last_received_at, processing_started_at, processed_at)
SELECT 'consumer-' || (get_byte(uuid_send(m.outbox_id), 15) % 3), m.outbox_id::text, m.message_type, 1, m.aggregate_id,
       'PROCESSED', 'APPLIED', 1, md5(m.outbox_id::text), m.created_at + interval '50 ms', m.created_at + interval '50 ms',
       m.created_at + interval '50 ms', m.created_at + interval '60 ms'
FROM m`

// fill writes orders orders (and their rows) spread over weeks weeks
// ending an hour ago; with weeks 0, at once, in the partitions the
// migrations made. The order the timeline step reads is the middle one.
// progress is called after each chunk.
func (db *volumeDB) fill(ctx context.Context, weeks, orders int, progress func(done int)) error {
	end := time.Now().Add(-time.Hour)
	start := end
	if weeks > 0 {
		// Mondays, as the relays' weekly partitions.
		monday := time.Now().UTC().Truncate(24 * time.Hour)
		for monday.Weekday() != time.Monday {
			monday = monday.Add(-24 * time.Hour)
		}
		start = monday.AddDate(0, 0, -7*weeks)
		err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config('bench_volume.start', $1, true)", start.Format(time.RFC3339)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, layoutSQL)
			return err
		})
		if err != nil {
			return fmt.Errorf("lay out the time partitions: %w", err)
		}
	}
	if _, err := outbox.CreateTimePartitions(ctx, db.pool, outbox.Week); err != nil {
		return err
	}
	if _, err := inbox.CreateTimePartitions(ctx, db.pool, outbox.Week); err != nil {
		return err
	}
	for lo := 0; lo < orders; lo += fillChunk {
		hi := min(lo+fillChunk, orders)
		if _, err := db.pool.Exec(ctx, fillSQL, lo, hi, start, end, orders); err != nil {
			return fmt.Errorf("fill orders %d to %d: %w", lo, hi, err)
		}
		progress(hi)
	}
	// As autovacuum would have left a year-old database: visibility map
	// set, statistics current.
	if _, err := db.pool.Exec(ctx, "VACUUM (ANALYZE) orders, order_state_transition, message_outbox, message_inbox"); err != nil {
		return err
	}
	return db.pool.QueryRow(ctx, "SELECT md5('volume' || $1::bigint)::uuid", orders/2).Scan(&db.order)
}

// reuse readies a database an earlier run filled (and kept) for another
// run: its time partitions made up to the horizon again, as the relays
// would, and the order the timeline step reads, the middle one of those it
// holds (fill's orders are all it holds).
func (db *volumeDB) reuse(ctx context.Context) error {
	if _, err := outbox.CreateTimePartitions(ctx, db.pool, outbox.Week); err != nil {
		return err
	}
	if _, err := inbox.CreateTimePartitions(ctx, db.pool, outbox.Week); err != nil {
		return err
	}
	return db.pool.QueryRow(ctx, "SELECT md5('volume' || (count(*) / 2))::uuid FROM orders").Scan(&db.order)
}
