package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// narrator prints the walkthrough and, unless it runs unattended, waits
// for Enter between steps.
type narrator struct {
	out   io.Writer
	in    *bufio.Reader // nil: unattended (-yes)
	step  int
	steps int
}

// printf writes to the terminal; a terminal that went away is no reason
// to stop the tour halfway through a fault.
func (n *narrator) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(n.out, format, args...)
}

// heading starts step n.
func (n *narrator) heading(title string) {
	n.step++
	n.printf("\n%s\n== Step %d of %d: %s\n%s\n", strings.Repeat("=", 78), n.step, n.steps, title, strings.Repeat("=", 78))
}

// say prints a paragraph.
func (n *narrator) say(format string, args ...any) {
	n.printf("\n"+format+"\n", args...)
}

// ok prints a check that held.
func (n *narrator) ok(format string, args ...any) {
	n.printf("  ✔ "+format+"\n", args...)
}

// look prints where to look in the tools beside the terminal.
func (n *narrator) look(lines ...string) {
	n.printf("\n  Look for yourself:\n")
	for _, l := range lines {
		n.printf("    - %s\n", l)
	}
}

// pause waits for Enter, unless unattended or ctx ends.
func (n *narrator) pause(ctx context.Context) error {
	if n.in == nil {
		return ctx.Err()
	}
	n.printf("\n[Enter: next step; Ctrl-C: stop] ")
	line := make(chan error, 1)
	go func() {
		_, err := n.in.ReadString('\n')
		line <- err
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-line:
		if errors.Is(err, io.EOF) {
			n.in = nil // nobody is typing: go on unattended
			n.printf("\n")
			return nil
		}
		return err
	}
}

// table prints rows under a header, aligned.
func (n *narrator) table(header []string, rows [][]string) {
	tw := tabwriter.NewWriter(n.out, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "    %s\n", strings.Join(header, "\t"))
	dashes := make([]string, len(header))
	for i, h := range header {
		dashes[i] = strings.Repeat("-", len(h))
	}
	_, _ = fmt.Fprintf(tw, "    %s\n", strings.Join(dashes, "\t"))
	for _, r := range rows {
		_, _ = fmt.Fprintf(tw, "    %s\n", strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	if len(rows) == 0 {
		n.printf("    (no rows)\n")
	}
}

// sql prints a query the way to type it into psql.
func (n *narrator) sql(query string) {
	n.printf("\n  psql> %s\n", strings.Join(strings.Fields(query), " "))
}

// ctl prints the orderctl command that shows the rows of a table printed
// next: the outbox and the inbox are read through their read APIs, as
// orderctl reads them (make ctl ARGS='...').
func (n *narrator) ctl(args string) {
	n.printf("\n  $ orderctl %s\n", args)
}

// failure is a walkthrough expectation that did not hold: the system did
// not behave as the pattern promises (or is not running as described).
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

func failf(format string, args ...any) error { return failure{fmt.Sprintf(format, args...)} }

// waitUntil polls cond every 50ms until it reports true, returns an error,
// or timeout passes (then it fails naming what it waited for).
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		done, err := cond(ctx)
		if err == nil && done {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return parent.Err()
			}
			if last != nil {
				return failf("waited %s for %s; last error: %v", timeout, what, last)
			}
			return failf("waited %s for %s", timeout, what)
		case <-tick.C:
		}
	}
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// short shortens an id for tables.
func short(id string) string {
	if len(id) > 13 {
		return id[:8] + "…" + id[len(id)-4:]
	}
	return id
}
