package tablestats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// cacheFor is how long a read serves scrapes: Prometheus scrapes every 5s
// in docker compose, so each scrape reads afresh, while faster or several
// scrapers do not multiply the queries.
const cacheFor = 4 * time.Second

var (
	attrTable = attribute.Key("table")
	attrKind  = attribute.Key("kind")
)

// Register reports table's figures (Tables) and the database's horizon
// (Horizon) as observable gauges of meter, read from db at scrape time, at
// most once per few seconds (docs/observability.md):
//
//	db.table.live_tuples, db.table.dead_tuples  {table}
//	db.table.size, db.table.index_size          {table}, bytes
//	db.table.vacuum_age                         {table}, seconds; not reported until vacuumed
//	db.xmin_horizon.age                         {kind}, seconds: the oldest holder of each kind, 0 when none
//
// Every process that registers reports the same horizon; take max() of it.
func Register(meter metric.Meter, db DB, table string) error {
	live, err := meter.Int64ObservableGauge("db.table.live_tuples", metric.WithUnit("{tuple}"),
		metric.WithDescription("Live tuples of the table, summed over its partitions (pg_stat_user_tables.n_live_tup)."))
	if err != nil {
		return err
	}
	dead, err := meter.Int64ObservableGauge("db.table.dead_tuples", metric.WithUnit("{tuple}"),
		metric.WithDescription("Dead tuples of the table not yet removed by vacuum, summed over its partitions (n_dead_tup)."))
	if err != nil {
		return err
	}
	size, err := meter.Int64ObservableGauge("db.table.size", metric.WithUnit("By"),
		metric.WithDescription("Size of the table without its indexes, summed over its partitions (pg_table_size)."))
	if err != nil {
		return err
	}
	indexSize, err := meter.Int64ObservableGauge("db.table.index_size", metric.WithUnit("By"),
		metric.WithDescription("Size of the table's indexes, summed over its partitions (pg_indexes_size)."))
	if err != nil {
		return err
	}
	vacuumAge, err := meter.Float64ObservableGauge("db.table.vacuum_age", metric.WithUnit("s"),
		metric.WithDescription("Time since the table (its partition vacuumed least recently) was last vacuumed or autovacuumed; absent until it has been."))
	if err != nil {
		return err
	}
	horizon, err := meter.Float64ObservableGauge("db.xmin_horizon.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest transaction horizon holder of each kind (session, slot, prepared) in the database, 0 when none: vacuum removes no dead tuple it may still see."))
	if err != nil {
		return err
	}
	r := &reader{db: db, table: table, slots: map[string]slotSeen{}}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		res := r.read(ctx, time.Now())
		if t := res.table; res.tableErr == nil {
			at := metric.WithAttributes(attrTable.String(table))
			o.ObserveInt64(live, t.LiveTuples, at)
			o.ObserveInt64(dead, t.DeadTuples, at)
			o.ObserveInt64(size, t.TableBytes, at)
			o.ObserveInt64(indexSize, t.IndexBytes, at)
			if t.Vacuumed {
				o.ObserveFloat64(vacuumAge, t.SinceVacuum.Seconds(), at)
			}
		}
		if res.horizonErr == nil {
			for _, kind := range Kinds {
				o.ObserveFloat64(horizon, OldestAge(res.holders, kind).Seconds(), metric.WithAttributes(attrKind.String(string(kind))))
			}
		}
		return errors.Join(res.tableErr, res.horizonErr)
	}, live, dead, size, indexSize, vacuumAge, horizon)
	return err
}

// OldestAge is the longest Age among the holders of kind, 0 when none.
func OldestAge(holders []Holder, kind Kind) time.Duration {
	var oldest time.Duration
	for _, h := range holders {
		if h.Kind == kind {
			oldest = max(oldest, h.Age)
		}
	}
	return oldest
}

// reader reads a table's figures and the horizon, and keeps them for
// cacheFor.
type reader struct {
	db    DB
	table string

	mu    sync.Mutex
	at    time.Time // of the last read, zero when none
	last  reading
	slots map[string]slotSeen // by slot name
}

// reading is what one read found: each of the two, or why not.
type reading struct {
	table      Table
	tableErr   error
	holders    []Holder
	horizonErr error
}

// slotSeen is when a slot's horizon was first seen at its xid.
type slotSeen struct {
	xid   uint32
	since time.Time
}

func (r *reader) read(ctx context.Context, now time.Time) reading {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && now.Sub(r.at) < cacheFor {
		return r.last
	}
	var res reading
	tables, err := Tables(ctx, r.db, r.table)
	switch {
	case err != nil:
		res.tableErr = err
	case len(tables) == 0:
		res.tableErr = fmt.Errorf("table statistics: no table %s", r.table)
	default:
		res.table = tables[0]
	}
	res.holders, res.horizonErr = Horizon(ctx, r.db)
	if res.horizonErr == nil {
		r.ageSlots(res.holders, now)
	}
	if res.tableErr == nil && res.horizonErr == nil { // a failed read is tried again at the next scrape
		r.at, r.last = now, res
	}
	return res
}

// ageSlots gives each slot the time since this reader first saw it hold
// its current xid: PostgreSQL keeps no time for a slot's xmin, so this is
// how long, at least, since this process started, the slot has held it.
func (r *reader) ageSlots(holders []Holder, now time.Time) {
	seen := map[string]slotSeen{}
	for i, h := range holders {
		if h.Kind != KindSlot {
			continue
		}
		s, ok := r.slots[h.Name]
		if !ok || s.xid != h.XID {
			s = slotSeen{xid: h.XID, since: now}
		}
		seen[h.Name] = s
		holders[i].Age, holders[i].AgeKnown = now.Sub(s.since), true
	}
	r.slots = seen
}
