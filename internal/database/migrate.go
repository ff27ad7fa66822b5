package database

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Schema is the goose migrations of one package (the outbox's, the
// inbox's, a service's), numbered on their own and recorded in a version
// table of their own, so that the sequences of several packages applied to
// one database never interleave.
type Schema struct {
	// Name names the schema in logs and in Status.
	Name string
	// FS holds its *.sql migrations at its root, in goose's numbered order.
	FS fs.FS
	// VersionTable is the goose table that records its applied versions.
	VersionTable string
}

// Migrator applies a list of schemas in order, each under goose's
// PostgreSQL advisory lock, so that replicas starting together apply each
// migration once. A schema comes after the ones its migrations build on
// (a service's grants after the outbox's tables).
type Migrator struct {
	schemas   []Schema
	providers []*goose.Provider
	db        *sql.DB
	logger    *slog.Logger
}

// NewMigrator prepares a migrator of schemas on pool. Close it when done.
func NewMigrator(pool *pgxpool.Pool, logger *slog.Logger, schemas ...Schema) (*Migrator, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	m := &Migrator{schemas: schemas, db: stdlib.OpenDBFromPool(pool), logger: logger}
	for _, s := range schemas {
		p, err := goose.NewProvider(goose.DialectPostgres, m.db, s.FS,
			goose.WithTableName(s.VersionTable), goose.WithSessionLocker(locker))
		if err != nil {
			_ = m.db.Close()
			return nil, fmt.Errorf("load the migrations of %s: %w", s.Name, err)
		}
		m.providers = append(m.providers, p)
	}
	return m, nil
}

// Up applies every pending migration, schema by schema.
func (m *Migrator) Up(ctx context.Context) error {
	applied := 0
	for i, p := range m.providers {
		results, err := p.Up(ctx)
		m.log(m.schemas[i], results)
		if err != nil {
			return fmt.Errorf("migrate %s up: %w", m.schemas[i].Name, err)
		}
		applied += len(results)
	}
	if applied == 0 {
		m.logger.InfoContext(ctx, "schema is up to date")
	}
	return nil
}

// Down rolls back the latest migration of the last schema that has one
// applied.
func (m *Migrator) Down(ctx context.Context) error {
	for i, p := range slices.Backward(m.providers) {
		version, err := p.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("migrate %s down: %w", m.schemas[i].Name, err)
		}
		if version == 0 {
			continue
		}
		result, err := p.Down(ctx)
		if result != nil {
			m.log(m.schemas[i], []*goose.MigrationResult{result})
		}
		if err != nil {
			return fmt.Errorf("migrate %s down: %w", m.schemas[i].Name, err)
		}
		return nil
	}
	return nil
}

// DownTo rolls back, the last schema first, every migration newer than
// version: DownTo(ctx, 0) rolls them all back.
func (m *Migrator) DownTo(ctx context.Context, version int64) error {
	for i, p := range slices.Backward(m.providers) {
		results, err := p.DownTo(ctx, version)
		m.log(m.schemas[i], results)
		if err != nil {
			return fmt.Errorf("migrate %s down to %d: %w", m.schemas[i].Name, version, err)
		}
	}
	return nil
}

// Status writes one line per migration: its schema, its file, applied or
// pending.
func (m *Migrator) Status(ctx context.Context, w io.Writer) error {
	for i, p := range m.providers {
		statuses, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migration status of %s: %w", m.schemas[i].Name, err)
		}
		for _, s := range statuses {
			applied := "pending"
			if s.State == goose.StateApplied {
				applied = "applied " + s.AppliedAt.Format("2006-01-02 15:04:05")
			}
			if _, err := fmt.Fprintf(w, "%-8s %-40s %s\n", m.schemas[i].Name, s.Source.Path, applied); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

func (m *Migrator) log(s Schema, results []*goose.MigrationResult) {
	for _, r := range results {
		m.logger.Info("migration applied",
			slog.String("schema", s.Name),
			slog.String("migration", r.Source.Path),
			slog.String("direction", r.Direction),
			slog.Duration("took", r.Duration))
	}
}
