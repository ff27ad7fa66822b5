package main

import "testing"

func TestParseStat(t *testing.T) {
	t.Parallel()
	// A command name with a space and a parenthesis in it, as a process
	// may give itself; the fields after it are those of proc(5).
	line := "4242 (odd) name) S 17 4242 4242 0 -1 4194560 900 0 0 0 250 75 30 12 20 0 8 0 1000 0 0\n"
	got, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{pid: 4242, ppid: 17, comm: "odd) name", cpu: 325, children: 42}
	if got != want {
		t.Errorf("parseStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "12 no-parens S 1", "12 (short) S 1 2 3", "x (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted it", bad)
		}
	}
}

func TestServerCPUKeepsEndedBackends(t *testing.T) {
	t.Parallel()
	before := map[int]procStat{
		1:  {pid: 1, comm: "systemd", cpu: 1000},
		10: {pid: 10, ppid: 1, comm: "postgres", cpu: 100, children: 50},
		11: {pid: 11, ppid: 10, comm: "postgres", cpu: 30}, // a backend that will end
		12: {pid: 12, ppid: 10, comm: "postgres", cpu: 40},
		20: {pid: 20, ppid: 1, comm: "beam.smp", cpu: 500},
	}
	// Backend 11 ended (its 35 ticks went to the server's children time),
	// backend 13 started, backend 12 ran on.
	after := map[int]procStat{
		1:  {pid: 1, comm: "systemd", cpu: 2000},
		10: {pid: 10, ppid: 1, comm: "postgres", cpu: 110, children: 85},
		12: {pid: 12, ppid: 10, comm: "postgres", cpu: 60},
		13: {pid: 13, ppid: 10, comm: "postgres", cpu: 5},
		20: {pid: 20, ppid: 1, comm: "beam.smp", cpu: 600},
	}
	// 10 (server) + 5 (the rest of backend 11) + 20 (backend 12) + 5 (backend 13)
	if got := serverCPU(after, "postgres") - serverCPU(before, "postgres"); got != 40 {
		t.Errorf("PostgreSQL used %d ticks, want 40", got)
	}
}

func TestLastingCPULeavesOutShortLivedProcesses(t *testing.T) {
	t.Parallel()
	before := map[int]procStat{
		20: {pid: 20, comm: "beam.smp", cpu: 500, children: 7},
		30: {pid: 30, comm: "beam.smp", cpu: 90}, // rabbitmqctl's VM, gone after
	}
	after := map[int]procStat{
		20: {pid: 20, comm: "beam.smp", cpu: 650, children: 9},
		31: {pid: 31, comm: "beam.smp", cpu: 40}, // another one, started after
	}
	if got := lastingCPU(before, after, "beam.smp"); got != 152 {
		t.Errorf("RabbitMQ used %d ticks, want 152 (the server's alone)", got)
	}
}

func TestBackendsCPUCountsThisDatabaseOnly(t *testing.T) {
	t.Parallel()
	const db = "orders_bench_1_ab"
	before := cpuSample{
		stats: map[int]procStat{
			11: {pid: 11, comm: "postgres", cpu: 30},
			12: {pid: 12, comm: "postgres", cpu: 40},
			14: {pid: 14, comm: "postgres", cpu: 80},
		},
		titles: map[int]string{
			11: "postgres: 15/main: postgres " + db + " 127.0.0.1(5001) idle",
			12: "postgres: 15/main: postgres orders_test_9_cd 127.0.0.1(5002) idle",
			14: "postgres: 15/main: postgres orders 127.0.0.1(5004) idle", // pid 14 is reused below
		},
	}
	after := cpuSample{
		stats: map[int]procStat{
			11: {pid: 11, comm: "postgres", cpu: 70},
			12: {pid: 12, comm: "postgres", cpu: 90},
			13: {pid: 13, comm: "postgres", cpu: 15},
			14: {pid: 14, comm: "postgres", cpu: 3},
		},
		titles: map[int]string{
			11: "postgres: 15/main: postgres " + db + " 127.0.0.1(5001) idle in transaction",
			12: "postgres: 15/main: postgres orders_test_9_cd 127.0.0.1(5002) idle",
			13: "postgres: 15/main: postgres " + db + " 127.0.0.1(5003) INSERT",
			14: "postgres: 15/main: postgres " + db + " 127.0.0.1(5005) idle",
		},
	}
	// 40 (backend 11) + 15 (backend 13, new) + 3 (a new backend 14)
	if got := backendsCPU(before, after, db); got != 58 {
		t.Errorf("the database's backends used %d ticks, want 58", got)
	}
}
