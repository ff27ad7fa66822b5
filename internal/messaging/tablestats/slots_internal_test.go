package tablestats

import (
	"testing"
	"time"
)

// PostgreSQL keeps no time for a slot's xmin: a slot's age counts from
// when the reader first saw it at its xid, starts again when the xid
// moves, and is forgotten with the slot.
func TestSlotAgeCountsFromFirstSeen(t *testing.T) {
	t.Parallel()
	r := &reader{slots: map[string]slotSeen{}}
	start := time.Now()
	read := func(at time.Duration, holders ...Holder) []Holder {
		r.ageSlots(holders, start.Add(at))
		return holders
	}
	slot := func(name string, xid uint32) Holder { return Holder{Kind: KindSlot, Name: name, XID: xid} }
	session := Holder{Kind: KindSession, Name: "s", Age: time.Minute, AgeKnown: true}

	if got := read(0, slot("a", 10), session); got[0].Age != 0 || !got[0].AgeKnown || got[1].Age != time.Minute {
		t.Fatalf("first sight: %+v", got)
	}
	if got := read(90*time.Second, slot("a", 10), slot("b", 20)); got[0].Age != 90*time.Second || got[1].Age != 0 {
		t.Fatalf("a held 90s, b new: %+v", got)
	}
	if got := read(100*time.Second, slot("a", 11), slot("b", 20)); got[0].Age != 0 || got[1].Age != 10*time.Second {
		t.Fatalf("a moved on, b held 10s: %+v", got)
	}
	read(110 * time.Second) // both gone
	if got := read(120*time.Second, slot("b", 20)); got[0].Age != 0 {
		t.Fatalf("b back after it was gone: %+v", got)
	}
	if got := OldestAge([]Holder{session, slot("a", 1), {Kind: KindSession, Age: time.Hour}}, KindSession); got != time.Hour {
		t.Errorf("OldestAge(session) = %s, want 1h", got)
	}
}
