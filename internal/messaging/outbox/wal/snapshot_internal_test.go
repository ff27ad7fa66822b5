package wal

import "testing"

// A snapshot sees a committed transaction once it no longer lists it as
// running, whatever the epoch; a snapshot older than the transaction does
// not.
func TestSnapshotSees(t *testing.T) {
	snap, err := parseSnapshot("100:105:101,103")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{99: true, 100: true, 101: false, 102: true, 103: false, 104: true, 105: false, 200: false} {
		if got := snap.sees(xid); got != want {
			t.Errorf("snapshot 100:105:101,103 sees %d: %v, want %v", xid, got, want)
		}
	}
	// Epoch 1: xmax 2^32+5. The log's 32-bit xid 0xfffffffe is the epoch
	// before's, ended; 3 is this epoch's, running.
	wrap, err := parseSnapshot("4294967290:4294967301:4294967299")
	if err != nil {
		t.Fatal(err)
	}
	if !wrap.sees(0xfffffffe) || wrap.sees(3) || !wrap.sees(4) || wrap.sees(5) {
		t.Errorf("across the epoch: sees 0xfffffffe %v, 3 %v, 4 %v, 5 %v; want true, false, true, false",
			wrap.sees(0xfffffffe), wrap.sees(3), wrap.sees(4), wrap.sees(5))
	}
	if (pgSnapshot{}).sees(1) {
		t.Error("no snapshot yet sees nothing")
	}
	if _, err := parseSnapshot("1:2"); err == nil {
		t.Error("a malformed snapshot parsed")
	}
}
