package outbox

import (
	"slices"
	"testing"
)

// A type is published once two looks in a row have found all its readers'
// queues (those the relay cannot bind, without a Reader.Bind): a consumer
// declares its queue, then binds it, and a look that falls between the two
// must not release the type.
func TestReaderQueuesAreFoundTwiceBeforeATypeIsPublished(t *testing.T) {
	readers := map[string][]string{"order.cancelled": {"a", "b"}, "order.fulfilled": {"c"}}
	look := func(before *readerCheck, missing map[string][]string) *readerCheck {
		c := &readerCheck{missing: missing}
		c.after(before, readers)
		return c
	}
	steps := []struct {
		name    string
		missing map[string][]string
		held    []string
	}{
		{"the first look: every type held once more", map[string][]string{"order.cancelled": {"b"}}, []string{"order.cancelled", "order.fulfilled"}},
		{"b still missing, c found twice", map[string][]string{"order.cancelled": {"b"}}, []string{"order.cancelled"}},
		{"b declared: found once", map[string][]string{}, []string{"order.cancelled"}},
		{"b found twice", map[string][]string{}, nil},
		{"b gone again", map[string][]string{"order.cancelled": {"b"}}, []string{"order.cancelled"}},
	}
	c := uncheckedReaders(readers)
	if got := c.held(); !slices.Equal(got, []string{"order.cancelled", "order.fulfilled"}) {
		t.Fatalf("before any look: held %v", got)
	}
	for _, s := range steps {
		c = look(c, s.missing)
		if got := c.held(); !slices.Equal(got, s.held) {
			t.Fatalf("%s: held %v, want %v", s.name, got, s.held)
		}
		if (c.notReady() == nil) != (len(s.held) == 0) {
			t.Fatalf("%s: not ready %v with %v held", s.name, c.notReady(), s.held)
		}
	}
}
