// Package tablestats reads what PostgreSQL knows of a mechanism's table
// (its live and dead tuples, its size and its indexes' size, when it was
// last vacuumed, summed over its partitions) and of the oldest transaction
// horizon holders of the database: the sessions, replication slots and
// prepared transactions that keep vacuum from removing dead tuples. A
// queue table that is inserted into, updated and deleted from all day
// bloats when its horizon is held; these figures show it.
//
// The outbox reports message_outbox with it and the inbox message_inbox
// (Register, as observable gauges); orderctl status reads the same figures
// (Tables, Horizon). Everything is read from the statistics views and
// functions, cheap enough for scrape time; the horizon's session details
// of other roles need pg_read_all_stats (docs/security.md).
package tablestats

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
)

// DB is what the figures are read through: a pool, a connection or a
// transaction.
type DB interface {
	database.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Table is what PostgreSQL's statistics say of one table: for a
// partitioned table (or one with inheritance children), summed over the
// partitions.
type Table struct {
	Name       string
	Partitions int // the partitions (descendants) summed; 0 for a plain table
	LiveTuples int64
	DeadTuples int64 // row versions vacuum has not removed yet
	// TableBytes is pg_table_size (the heap, its TOAST and maps) and
	// IndexBytes pg_indexes_size, of each partition written to since its
	// last vacuum; of the others (quiet: no row inserted, updated or
	// deleted since), the pages their last vacuum or analyze counted, from
	// pg_class, the maps left out: reading the files of every partition
	// (pg_table_size) cost orderctl status most of its time with a year
	// of weekly partitions (docs/benchmarks.md, "A year of history").
	TableBytes int64
	IndexBytes int64
	// SinceVacuum is the time since the last vacuum or autovacuum (of the
	// partition vacuumed least recently); Vacuumed is false, and
	// SinceVacuum 0, while some partition holding rows never was.
	SinceVacuum time.Duration
	Vacuumed    bool
}

// tablesSQL sums the statistics of each named table and its descendants
// (pg_inherits holds declarative partitions and inheritance children
// alike, at every level). It calls the functions behind
// pg_stat_user_tables for the few relations of the tree rather than
// reading the view, which covers every table of the database. The sizes
// of a quiet partition (vacuumed, and nothing inserted, updated or
// deleted since its last vacuum and analyze) are its pg_class pages,
// which that vacuum left as they are; only the others' files are read.
const tablesSQL = `
WITH RECURSIVE tree (name, relid, root) AS (
    SELECT name, to_regclass(name)::oid, true
    FROM unnest($1::text[]) AS name
    WHERE to_regclass(name) IS NOT NULL
  UNION ALL
    SELECT tree.name, i.inhrelid, false
    FROM tree JOIN pg_inherits AS i ON i.inhparent = tree.relid
), stats AS (
    SELECT tree.name, tree.root, tree.relid, c.relkind, c.relpages, c.reltoastrelid AS toast,
           pg_stat_get_live_tuples(tree.relid) AS live,
           pg_stat_get_dead_tuples(tree.relid) AS dead,
           greatest(pg_stat_get_last_vacuum_time(tree.relid), pg_stat_get_last_autovacuum_time(tree.relid)) AS vacuumed,
           pg_stat_get_ins_since_vacuum(tree.relid) = 0 AND pg_stat_get_mod_since_analyze(tree.relid) = 0 AS unchanged
    FROM tree JOIN pg_class AS c ON c.oid = tree.relid
), figures AS (
    SELECT name, root, relkind, live, dead, vacuumed,
           CASE WHEN quiet THEN (relpages + coalesce((SELECT t.relpages FROM pg_class t WHERE t.oid = toast), 0)
                                 + coalesce((SELECT sum(ti.relpages) FROM pg_index x JOIN pg_class ti ON ti.oid = x.indexrelid
                                             WHERE x.indrelid = toast), 0))::bigint * current_setting('block_size')::bigint
                ELSE coalesce(pg_table_size(relid), 0) END AS table_bytes,
           CASE WHEN quiet THEN coalesce((SELECT sum(ci.relpages) FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid
                                          WHERE x.indrelid = relid), 0)::bigint * current_setting('block_size')::bigint
                ELSE coalesce(pg_indexes_size(relid), 0) END AS index_bytes
    FROM (SELECT stats.*, relkind = 'r' AND vacuumed IS NOT NULL AND dead = 0 AND unchanged AS quiet FROM stats) AS q
)
SELECT name,
       count(*) FILTER (WHERE NOT root)::int,
       sum(live)::bigint, sum(dead)::bigint, sum(table_bytes)::bigint, sum(index_bytes)::bigint,
       CASE WHEN bool_or(vacuumed IS NULL AND relkind <> 'p' AND live + dead > 0) THEN NULL
            ELSE extract(epoch FROM statement_timestamp() - min(vacuumed))::float8 END
FROM figures
GROUP BY name`

// lockTimeout bounds the wait for a table's lock: pg_table_size opens each
// relation (ACCESS SHARE), which waits behind DDL such as dropping a
// partition, and anything queued behind that DDL would wait on this read.
const lockTimeout = "500ms"

// Tables reads the figures of the named tables (schema-qualified or found
// on the search path), in the order named; a table that does not exist is
// left out. A role reads them without any privilege on the tables.
func Tables(ctx context.Context, db DB, names ...string) ([]Table, error) {
	byName := map[string]Table{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, tablesSQL, names)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				t     Table
				since *float64
			)
			if err := rows.Scan(&t.Name, &t.Partitions, &t.LiveTuples, &t.DeadTuples, &t.TableBytes, &t.IndexBytes, &since); err != nil {
				return err
			}
			if since != nil {
				t.SinceVacuum, t.Vacuumed = max(0, time.Duration(*since*float64(time.Second))), true
			}
			byName[t.Name] = t
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("table statistics: %w", database.Translate(err))
	}
	out := make([]Table, 0, len(byName))
	for _, name := range names {
		if t, ok := byName[name]; ok {
			out = append(out, t)
		}
	}
	return out, nil
}
