package tablestats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/yourorg/orders/internal/database"
)

// Kind is what holds a transaction horizon back.
type Kind string

// The kinds of horizon holders, the values of the kind label.
const (
	KindSession  Kind = "session"  // a transaction or snapshot of a session (pg_stat_activity)
	KindSlot     Kind = "slot"     // a replication slot's xmin or catalog_xmin
	KindPrepared Kind = "prepared" // a prepared transaction, not yet committed or rolled back
)

// Kinds are every kind, in a fixed order.
var Kinds = []Kind{KindSession, KindSlot, KindPrepared}

// Holder is one thing holding the database's transaction horizon back:
// vacuum removes no row version that a transaction older than XID might
// still see.
type Holder struct {
	Kind Kind
	// Name is the session's application_name, the slot's name or the
	// prepared transaction's gid.
	Name string
	// State is the session's state ("idle in transaction", "active"), the
	// slot's ("active", "inactive"), or the prepared transaction's owner.
	State string
	PID   int32 // the session's, or the slot's walsender; 0 when none
	// XID is the oldest transaction id it holds (the older of a session's
	// backend_xid and backend_xmin, of a slot's xmin and catalog_xmin);
	// XIDAge is how many transactions ago that was.
	XID    uint32
	XIDAge int64
	// Age is the time since the session's transaction started or the
	// transaction was prepared. PostgreSQL keeps no time for a slot's xmin:
	// AgeKnown is false for slots here, and Register's gauge counts from
	// when it first saw the slot's xmin where it is.
	Age      time.Duration
	AgeKnown bool
}

// ErrHidden is Horizon's error when the role may not see the transaction
// of another role's session that holds the horizon: it needs
// pg_read_all_stats (or to be that role).
var ErrHidden = errors.New("a session of another role holds the horizon, and this role may not see its transaction: grant it pg_read_all_stats")

// horizonSQL lists what holds the horizon of the current database: its
// sessions' transactions and snapshots (other databases' do not hold this
// one's tables back; physical walsenders, in no database, do with
// hot_standby_feedback), the slots of this database or of none, and its
// prepared transactions; oldest first. This session and autovacuum's
// workers, whose snapshots vacuum ignores, are left out. A session's
// transaction and state are visible only to its role and to members of
// pg_read_all_stats (the others show none, not even a backend_type):
// visible says which.
const horizonSQL = `
SELECT kind, name, state, pid, horizon::text, age(horizon), seconds, visible
FROM (
    SELECT 'session' AS kind, coalesce(application_name, '') AS name, coalesce(state, '') AS state, pid,
           CASE WHEN backend_xid IS NULL OR age(backend_xmin) > age(backend_xid) THEN backend_xmin ELSE backend_xid END AS horizon,
           extract(epoch FROM statement_timestamp() - xact_start)::float8 AS seconds,
           backend_type IS NOT NULL AS visible
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid()
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
      AND (datname = current_database() OR datid IS NULL)
      AND backend_type IS DISTINCT FROM 'autovacuum worker'
  UNION ALL
    SELECT 'slot', slot_name::text, CASE WHEN active THEN 'active' ELSE 'inactive' END, coalesce(active_pid, 0),
           CASE WHEN xmin IS NULL OR age(catalog_xmin) > age(xmin) THEN catalog_xmin ELSE xmin END,
           NULL, true
    FROM pg_replication_slots
    WHERE (xmin IS NOT NULL OR catalog_xmin IS NOT NULL)
      AND (database IS NULL OR database = current_database())
  UNION ALL
    SELECT 'prepared', gid, owner::text, 0, transaction,
           extract(epoch FROM statement_timestamp() - prepared)::float8, true
    FROM pg_prepared_xacts
    WHERE database = current_database()
) AS holders
ORDER BY age(horizon) DESC, seconds DESC NULLS LAST`

// Horizon lists what holds the current database's transaction horizon
// back, the oldest (by transaction ids) first; none when nothing does.
// It fails with ErrHidden when the role may not see a session that holds
// it: the list would be wrong.
func Horizon(ctx context.Context, db database.DBTX) ([]Holder, error) {
	rows, err := db.Query(ctx, horizonSQL)
	if err != nil {
		return nil, fmt.Errorf("transaction horizon: %w", database.Translate(err))
	}
	defer rows.Close()
	var (
		out    []Holder
		hidden int
	)
	for rows.Next() {
		var (
			h       Holder
			xid     string
			seconds *float64
			visible bool
		)
		if err := rows.Scan(&h.Kind, &h.Name, &h.State, &h.PID, &xid, &h.XIDAge, &seconds, &visible); err != nil {
			return nil, fmt.Errorf("transaction horizon: %w", err)
		}
		if !visible {
			hidden++
			continue
		}
		x, err := strconv.ParseUint(xid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("transaction horizon: xid %q: %w", xid, err)
		}
		h.XID = uint32(x)
		if seconds != nil {
			h.Age, h.AgeKnown = max(0, time.Duration(*seconds*float64(time.Second))), true
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("transaction horizon: %w", database.Translate(err))
	}
	if hidden > 0 {
		return nil, fmt.Errorf("transaction horizon: %d sessions hidden: %w", hidden, ErrHidden)
	}
	return out, nil
}
