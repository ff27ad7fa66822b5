package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/testenv"
)

// The partition function is written twice, in SQL (outbox_partition, which
// the claim uses) and in Go (PartitionOf): both give every id the same
// partition, for every partition count up to the bound.
func TestPartitionOfAgreesWithTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t, outbox.Schema).URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	ids := []string{"", "a", "abcd", "eleven-char", "twelve-chars", "thirteen-chars", "ünïcødé aggregate"}
	for range 200 {
		ids = append(ids, uuid.NewString())
	}
	counts := []int{1, 2, 3, 7, 8, 64, 1000, outbox.MaxPartitions}
	for _, n := range counts {
		var got []int32
		if err := conn.QueryRow(ctx, `SELECT array_agg(outbox_partition(id, $2) ORDER BY ord)
			FROM unnest($1::text[]) WITH ORDINALITY AS t(id, ord)`, ids, n).Scan(&got); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if want := outbox.PartitionOf(id, n); int(got[i]) != want {
				t.Fatalf("partition of %q among %d: outbox_partition says %d, PartitionOf %d", id, n, got[i], want)
			}
		}
	}
	var hashes []int32
	if err := conn.QueryRow(ctx, `SELECT array_agg(hashtext(id) ORDER BY ord) FROM unnest($1::text[]) WITH ORDINALITY AS t(id, ord)`, ids).Scan(&hashes); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if got := int32(outbox.HashText([]byte(id))); got != hashes[i] {
			t.Fatalf("hashtext(%q) = %d, hashText %d", id, hashes[i], got)
		}
	}
}
