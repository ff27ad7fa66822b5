package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc: clock ticks of 1/100 s on
// every Linux architecture this runs on (USER_HZ, what sysconf(_SC_CLK_TCK)
// returns).
const userHZ = 100

// procStat is what bench-flow reads of /proc/<pid>/stat.
type procStat struct {
	pid, ppid int
	comm      string
	// cpu is utime + stime: the process's own CPU time, in ticks.
	cpu int64
	// children is cutime + cstime: the CPU time of its children that have
	// ended and been waited for, in ticks.
	children int64
}

// parseStat parses the content of /proc/<pid>/stat. The command name
// (field 2) is in parentheses and may itself hold spaces and parentheses,
// so the fields after it are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, errors.New("no (comm) in stat")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return procStat{}, fmt.Errorf("pid: %w", err)
	}
	// rest[0] is field 3 (state), so field n is rest[n-3].
	rest := strings.Fields(string(b[end+1:]))
	if len(rest) < 15 {
		return procStat{}, fmt.Errorf("stat of %d has %d fields after comm, want 15 or more", pid, len(rest))
	}
	var f [18]int64
	for n := 4; n <= 17; n++ {
		if n == 4 || n >= 14 {
			if f[n], err = strconv.ParseInt(rest[n-3], 10, 64); err != nil {
				return procStat{}, fmt.Errorf("stat of %d, field %d: %w", pid, n, err)
			}
		}
	}
	return procStat{pid: pid, ppid: int(f[4]), comm: string(b[open+1 : end]), cpu: f[14] + f[15], children: f[16] + f[17]}, nil
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// allStats reads the stat of every process on the machine (those that end
// while it reads are left out).
func allStats() map[int]procStat {
	out := map[int]procStat{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if s, err := readStat(pid); err == nil {
			out[pid] = s
		}
	}
	return out
}

// serverCPU is the CPU time of every process named comm (a server and the
// processes it forks, such as PostgreSQL's backends), in ticks: their own
// time, plus, for each one whose parent has another name (the server's
// root), the time of its children that have ended. A backend that ends
// between two readings so stays counted, through its parent.
func serverCPU(stats map[int]procStat, comm string) int64 {
	var ticks int64
	for _, s := range stats {
		if s.comm != comm {
			continue
		}
		ticks += s.cpu
		if parent, ok := stats[s.ppid]; !ok || parent.comm != comm {
			ticks += s.children
		}
	}
	return ticks
}

// lastingCPU is the CPU time used between two readings by the processes
// named comm that were running at both, in ticks. It leaves out the
// short-lived ones: for beam.smp, the Erlang VMs of rabbitmqctl and
// rabbitmq-diagnostics, whose time would otherwise vanish from the second
// reading.
func lastingCPU(before, after map[int]procStat, comm string) int64 {
	var ticks int64
	for pid, a := range after {
		if b, ok := before[pid]; ok && a.comm == comm && b.comm == comm {
			ticks += (a.cpu + a.children) - (b.cpu + b.children)
		}
	}
	return ticks
}

// backendsCPU is the CPU time used between two readings by the PostgreSQL
// backends connected to database, in ticks: the processes named postgres
// whose title ("postgres: 15/main: user database host state") names it.
// A backend that started in between counts from zero; one that ended in
// between is missing (the services' pools keep theirs open).
func backendsCPU(before, after cpuSample, database string) int64 {
	// The title ends with the backend's state (idle, INSERT, ...), which
	// changes: the database is the word to look for.
	connected := func(title string) bool { return slices.Contains(strings.Fields(title), database) }
	var ticks int64
	for pid, a := range after.stats {
		if a.comm != "postgres" || !connected(after.titles[pid]) {
			continue
		}
		ticks += a.cpu
		if b, ok := before.stats[pid]; ok && b.comm == "postgres" && connected(before.titles[pid]) {
			ticks -= b.cpu
		}
	}
	return ticks
}

// title is the command line of pid, its arguments joined by spaces: a
// PostgreSQL backend's title.
func title(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// machineCPU is the busy time of every CPU of the machine since boot, in
// ticks: the first line of /proc/stat less idle and iowait.
func machineCPU() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat starts with %q", line)
	}
	var busy int64
	// user nice system idle iowait irq softirq steal (guest time is already
	// in user).
	for i, f := range fields[1:min(len(fields), 9)] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, nil
}

// cpuSample is the CPU time of every process of the machine, at one moment.
type cpuSample struct {
	at       time.Time
	children map[string]int64 // bench-flow's children, by name (order-api, ...)
	stats    map[int]procStat
	titles   map[int]string // of the postgres processes
	machine  int64
}

// sampleCPU reads the CPU time of every process, and of the machine.
// children names bench-flow's children: each must be running.
func sampleCPU(children map[string]int) (cpuSample, error) {
	s := cpuSample{at: time.Now(), children: map[string]int64{}, stats: allStats(), titles: map[int]string{}}
	for name, pid := range children {
		st, ok := s.stats[pid]
		if !ok {
			return s, fmt.Errorf("%s (pid %d) is not running", name, pid)
		}
		s.children[name] = st.cpu + st.children
	}
	for pid, st := range s.stats {
		if st.comm == "postgres" {
			s.titles[pid] = title(pid)
		}
	}
	var err error
	s.machine, err = machineCPU()
	return s, err
}

// seconds converts ticks to seconds.
func seconds(ticks int64) float64 { return float64(ticks) / userHZ }

// treeCPU is the CPU time of process root and of every process under it
// (a PostgreSQL server of bench-flow's own: the postmaster, its
// backends and its background processes), in ticks, with the time of
// the children root has waited for (a backend that ended).
func treeCPU(stats map[int]procStat, root int) int64 {
	under := func(pid int) bool {
		for range 64 { // deeper than any process tree
			if pid == root {
				return true
			}
			s, ok := stats[pid]
			if !ok || s.ppid == 0 {
				return false
			}
			pid = s.ppid
		}
		return false
	}
	var ticks int64
	for pid, s := range stats {
		if under(pid) {
			ticks += s.cpu
		}
	}
	return ticks + stats[root].children
}

// serverUse is the CPU time of PostgreSQL between two readings: of the
// server of bench-flow's own (serverPID) when there is one, else of
// every process named postgres on the machine, whoever's clients they
// serve.
func serverUse(serverPID int, before, after cpuSample) cpuUse {
	if serverPID != 0 {
		return cpuUse{name: "PostgreSQL, the whole server", seconds: seconds(treeCPU(after.stats, serverPID) - treeCPU(before.stats, serverPID))}
	}
	return cpuUse{name: "PostgreSQL, the whole server", seconds: seconds(serverCPU(after.stats, "postgres") - serverCPU(before.stats, "postgres")), shared: true}
}
