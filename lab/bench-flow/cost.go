package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// dbCost is what a run cost the database, from PostgreSQL's statistics:
// counters read before the load and after the processes have stopped (a
// backend sends its table and database counters when it ends), so that
// their difference is the run's.
type dbCost struct {
	commits, rollbacks int64
	// writes are the rows each table of the run's database had inserted,
	// updated and deleted, by table name.
	writes map[string]rowWrites
	// statements are the calls of each statement of the run's database,
	// by pg_stat_statements' query id; nil when the server does not load
	// pg_stat_statements.
	statements map[int64]statement
	// The server's WAL: records, bytes, and the fsyncs of its files. On a
	// server of its own (-own-postgres) they are the run's; on a shared
	// one they include every other client's.
	walRecords, walBytes, walSyncs int64
}

type rowWrites struct{ inserted, updated, deleted int64 }

type statement struct {
	query string
	calls int64
}

// readDBCost reads the counters of database name on the server of
// adminURL (its "postgres" database) and of the database itself.
func readDBCost(ctx context.Context, adminURL, dbURL, name string) (dbCost, error) {
	c := dbCost{writes: map[string]rowWrites{}}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return c, err
	}
	defer admin.Close(ctx)
	err = admin.QueryRow(ctx, `SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&c.commits, &c.rollbacks)
	if err != nil {
		return c, fmt.Errorf("pg_stat_database: %w", err)
	}
	if err := admin.QueryRow(ctx, `SELECT wal_records, wal_bytes::bigint, wal_sync FROM pg_stat_wal`).Scan(&c.walRecords, &c.walBytes, &c.walSyncs); err != nil {
		return c, fmt.Errorf("pg_stat_wal: %w", err)
	}
	var loaded bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')`).Scan(&loaded); err != nil {
		return c, err
	}
	if loaded {
		c.statements = map[int64]statement{}
		rows, err := admin.Query(ctx, `SELECT s.queryid, s.query, s.calls FROM pg_stat_statements s
			JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1 AND s.queryid IS NOT NULL`, name)
		if err != nil {
			return c, fmt.Errorf("pg_stat_statements: %w", err)
		}
		for rows.Next() {
			var id int64
			var s statement
			if err := rows.Scan(&id, &s.query, &s.calls); err != nil {
				return c, err
			}
			s.calls += c.statements[id].calls // the same query id under two users
			c.statements[id] = s
		}
		if err := rows.Err(); err != nil {
			return c, err
		}
	}

	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return c, err
	}
	defer db.Close(ctx)
	rows, err := db.Query(ctx, `SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables`)
	if err != nil {
		return c, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	for rows.Next() {
		var t string
		var w rowWrites
		if err := rows.Scan(&t, &w.inserted, &w.updated, &w.deleted); err != nil {
			return c, err
		}
		c.writes[t] = w
	}
	return c, rows.Err()
}

// enableStatements creates pg_stat_statements in the server's "postgres"
// database, where it is loaded (-own-postgres); elsewhere it does nothing.
func enableStatements(ctx context.Context, adminURL string) error {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	var loaded bool
	if err := admin.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY (string_to_array(current_setting('shared_preload_libraries'), ', '))`).Scan(&loaded); err != nil || !loaded {
		return err
	}
	_, err = admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	return err
}

// since is what the database did between two readings.
func (c dbCost) since(before dbCost) dbCost {
	d := dbCost{commits: c.commits - before.commits, rollbacks: c.rollbacks - before.rollbacks,
		walRecords: c.walRecords - before.walRecords, walBytes: c.walBytes - before.walBytes, walSyncs: c.walSyncs - before.walSyncs,
		writes: map[string]rowWrites{}}
	for t, w := range c.writes {
		b := before.writes[t]
		d.writes[t] = rowWrites{w.inserted - b.inserted, w.updated - b.updated, w.deleted - b.deleted}
	}
	if c.statements != nil {
		d.statements = map[int64]statement{}
		for id, s := range c.statements {
			if n := s.calls - before.statements[id].calls; n > 0 {
				d.statements[id] = statement{s.query, n}
			}
		}
	}
	return d
}

// statementKind is the first word of a statement after its comment
// lines, upper-cased: SELECT, INSERT, BEGIN, COMMIT, ... A WITH is named
// by the word of its main statement, after the last parenthesis.
func statementKind(query string) string {
	// sqlc's statements start with a comment line naming them.
	q := strings.TrimSpace(query)
	for strings.HasPrefix(q, "--") {
		_, q, _ = strings.Cut(q, "\n")
		q = strings.TrimSpace(q)
	}
	fields := strings.Fields(q)
	if len(fields) == 0 {
		return ""
	}
	word := strings.ToUpper(strings.TrimRight(fields[0], ";"))
	if word == "WITH" {
		// The main statement's verb is the first at parenthesis depth 0.
		depth := 0
		for i, r := range q {
			switch {
			case r == '(':
				depth++
			case r == ')':
				depth--
			case depth == 0 && (i == 0 || !isWordRune(rune(q[i-1]))):
				for _, verb := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE"} {
					if len(q) >= i+len(verb) && strings.EqualFold(q[i:i+len(verb)], verb) && (len(q) == i+len(verb) || !isWordRune(rune(q[i+len(verb)]))) {
						return verb + " (WITH)"
					}
				}
			}
		}
	}
	return word
}

// byKind adds up the statements' calls by kind.
func (c dbCost) byKind() map[string]int64 {
	out := map[string]int64{}
	for _, s := range c.statements {
		out[statementKind(s.query)] += s.calls
	}
	return out
}

// costLine is one line of the budget: a name, and a figure per order.
type costLine struct {
	name     string
	perOrder float64
}

// budget is a run's cost per order, line by line, in a stable order: CPU
// milliseconds of each process and server, then the database's work.
func (r result) budget() []costLine {
	per := func(v float64) float64 {
		if r.finished == 0 {
			return 0
		}
		return v / float64(r.finished)
	}
	var lines []costLine
	relays := 0.0
	for _, c := range r.cpu {
		switch {
		case strings.HasPrefix(c.name, "outbox-relay-"):
			relays += c.seconds
		case c.name == "loadgen (the client)", c.name == machineName:
		default:
			lines = append(lines, costLine{"CPU ms: " + c.name, per(c.seconds * 1000)})
		}
	}
	lines = append(lines, costLine{"CPU ms: outbox-relays", per(relays * 1000)})
	d := r.db
	lines = append(lines,
		costLine{"transactions committed", per(float64(d.commits))},
		costLine{"transactions rolled back", per(float64(d.rollbacks))},
		costLine{"WAL records", per(float64(d.walRecords))},
		costLine{"WAL bytes", per(float64(d.walBytes))},
		costLine{"WAL fsyncs", per(float64(d.walSyncs))},
	)
	for _, t := range slices.Sorted(maps.Keys(d.writes)) {
		w := d.writes[t]
		lines = append(lines,
			costLine{"rows inserted: " + t, per(float64(w.inserted))},
			costLine{"rows updated: " + t, per(float64(w.updated))},
			costLine{"rows deleted: " + t, per(float64(w.deleted))})
	}
	if d.statements != nil {
		kinds := d.byKind()
		total := int64(0)
		for _, k := range slices.Sorted(maps.Keys(kinds)) {
			lines = append(lines, costLine{"statements: " + k, per(float64(kinds[k]))})
			total += kinds[k]
		}
		lines = append(lines, costLine{"statements: all", per(float64(total))})
	}
	return lines
}

// printBudget prints a run's cost per order, and its busiest statements.
func (r result) printBudget(w io.Writer, top int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "cost per order (%d orders final)\n", r.finished)
	for _, l := range r.budget() {
		if l.perOrder != 0 {
			fmt.Fprintf(&b, "  %-52s %12.3f\n", l.name, l.perOrder)
		}
	}
	if r.db.statements == nil {
		b.WriteString("  (statements: the server does not load pg_stat_statements; -own-postgres does)\n")
	} else {
		stmts := slices.SortedFunc(maps.Values(r.db.statements), func(a, b statement) int { return int(b.calls - a.calls) })
		fmt.Fprintf(&b, "the %d statements called most, calls per order:\n", min(top, len(stmts)))
		for _, s := range stmts[:min(top, len(stmts))] {
			fmt.Fprintf(&b, "  %8.3f  %s\n", float64(s.calls)/float64(max(r.finished, 1)), oneLine(s.query, 110))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// oneLine squeezes a statement's white space and cuts it at n runes.
func oneLine(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	if r := []rune(q); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return q
}

// printComparison prints, for each rate, the mean cost per order of each
// version over its rounds, and the ratio of this checkout's to the other's.
func printComparison(w io.Writer, against string, results []result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nCost per order: this checkout (new) against %s (old), the mean of each version's runs at each rate\n", against)
	rates := []float64{}
	for _, r := range results {
		if !slices.Contains(rates, r.rate) {
			rates = append(rates, r.rate)
		}
	}
	for _, rate := range rates {
		mean := map[string]map[string]float64{}
		runs := map[string]int{}
		var order []string
		for _, r := range results {
			if r.rate != rate {
				continue
			}
			if mean[r.version] == nil {
				mean[r.version] = map[string]float64{}
			}
			runs[r.version]++
			for _, l := range r.budget() {
				if !slices.Contains(order, l.name) {
					order = append(order, l.name)
				}
				mean[r.version][l.name] += l.perOrder
			}
		}
		if runs["new"] == 0 || runs["old"] == 0 {
			return errors.New("a rate without a run of each version")
		}
		fmt.Fprintf(&b, "\n%g orders/s (%d runs of each)\n\n| per order | old | new | new/old |\n|---|---|---|---|\n", rate, runs["new"])
		for _, name := range order {
			o, n := mean["old"][name]/float64(runs["old"]), mean["new"][name]/float64(runs["new"])
			if o == 0 && n == 0 {
				continue
			}
			ratio := "—"
			if o != 0 {
				ratio = fmt.Sprintf("%.2f", n/o)
			}
			fmt.Fprintf(&b, "| %s | %.3f | %.3f | %s |\n", name, o, n, ratio)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func isWordRune(r rune) bool {
	return r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
