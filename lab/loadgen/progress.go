package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows how far a phase has got: a bar redrawn in place on a
// terminal, a plain line every few seconds anywhere else (a log, a pipe).
type progress struct {
	done chan struct{}
	wg   sync.WaitGroup
}

const (
	barWidth       = 30
	redrawInterval = 200 * time.Millisecond
	lineInterval   = 5 * time.Second
)

// startProgress shows status on w until stop: status returns the fraction
// done (0 to 1) and a line that says what is done.
func startProgress(w io.Writer, status func() (float64, string)) *progress {
	p := &progress{done: make(chan struct{})}
	terminal := isTerminal(w)
	interval := lineInterval
	if terminal {
		interval = redrawInterval
	}
	draw := func() {
		frac, line := status()
		if terminal {
			// \r back to the start of the line, \x1b[K clears what is left of
			// a longer line before.
			_, _ = fmt.Fprintf(w, "\r%s %s\x1b[K", bar(frac), line)
		} else {
			_, _ = fmt.Fprintf(w, "%3.0f%% %s\n", 100*min(max(frac, 0), 1), line)
		}
	}
	p.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				draw()
				if terminal {
					_, _ = fmt.Fprintln(w)
				}
				return
			case <-tick.C:
				draw()
			}
		}
	})
	return p
}

// stop ends the display, drawing it a last time.
func (p *progress) stop() {
	close(p.done)
	p.wg.Wait()
}

// bar draws frac (0 to 1) as [#####.....] 50%.
func bar(frac float64) string {
	frac = min(max(frac, 0), 1)
	full := int(frac * barWidth)
	return fmt.Sprintf("[%s%s] %3.0f%%", strings.Repeat("#", full), strings.Repeat(".", barWidth-full), 100*frac)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
