// Package docs holds the project's documentation; it has no code. Its test
// keeps every Markdown file of the repository honest: each relative link
// leads to a file that exists, each #anchor to a heading of its target, each
// link named after code ([`MoveOrder`](../internal/store/orders.go)) to a
// file that still has that name, and each diagram is a non-empty mermaid
// block that GitHub renders.
package docs

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// skipDirs are never searched for Markdown files.
var skipDirs = []string{".git", "vendor", "node_modules", "bin"}

// TestMarkdownLinks checks every *.md file of the repository.
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	for _, want := range []string{"README.md", "docs/architecture.md", "docs/messaging.md"} {
		if !slices.Contains(files, want) {
			t.Fatalf("%s not found among the Markdown files %v", want, files)
		}
	}
	c := newChecker(root)
	for _, f := range files {
		for _, p := range c.check(f) {
			t.Error(p)
		}
	}
}

// docs/README.md is the reading order: it links every page of docs/, and
// the README links it.
func TestIndexListsEveryPage(t *testing.T) {
	t.Parallel()
	index, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range inlineLink.FindAllStringSubmatch(stripCodeSpans(string(index)), -1) {
		target, _, _ := strings.Cut(m[1], "#")
		linked[target] = true
	}
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 2 {
		t.Fatalf("found only %v in docs/", pages)
	}
	for _, page := range pages {
		if page != "README.md" && !linked[page] {
			t.Errorf("docs/README.md does not list %s: give it its line in the reading order", page)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "](docs/README.md)") {
		t.Error("README.md does not link docs/README.md, the reading order")
	}
}

// The docs stay short enough to read: every page of docs/ together within
// maxWords, no page over maxPageWords. A fact is said once, on the page that
// owns it, and linked from the others.
const (
	maxWords     = 25000
	maxPageWords = 4000
)

func TestWordBudget(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 2 {
		t.Fatalf("found only %v in docs/", pages)
	}
	total := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		n := len(strings.Fields(string(raw)))
		total += n
		if n > maxPageWords {
			t.Errorf("docs/%s has %d words, over the %d a page may have: split it or say less", page, n, maxPageWords)
		}
	}
	if total > maxWords {
		t.Errorf("docs/*.md have %d words together, over the budget of %d: say a thing once and link to it", total, maxWords)
	}
}

// migrationName is a migration file's name as the docs write it.
var migrationName = regexp.MustCompile(`\b\d{5}_[a-z0-9_]+\.sql\b`)

// A migration named in the docs exists: a number written down goes stale
// when migrations are added (the next one is derived, never written).
func TestNamedMigrationsExist(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range markdownFiles(t, root) {
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range migrationName.FindAllString(string(raw), -1) {
			seen++
			if _, err := os.Stat(filepath.Join(root, "migrations", name)); err != nil {
				t.Errorf("%s names the migration %s, which migrations/ does not have", f, name)
			}
		}
	}
	if seen == 0 {
		t.Error("no Markdown file names a migration: the search is broken")
	}
}

// The checker finds each kind of mistake it exists for, and accepts what
// GitHub accepts.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		file := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("code/main.go", "package main\n\nfunc main() {}\n")
	write("docs/target.md", "# The `message_outbox` table\n\n## Relay, and publish!\n\n## Relay, and publish!\n\n"+
		"```sh\n# not a heading\n```\n\n<a name=\"custom\"></a>\n")
	write("docs/good.md", strings.Join([]string{
		"# Good",
		"[file](target.md), [dir](../code), [code](../code/main.go), [line](../code/main.go#L3)",
		"[heading](target.md#the-message_outbox-table), [dup](target.md#relay-and-publish-1), [html](target.md#custom)",
		"[self](#good), [abs](https://example.com/nowhere), [mail](mailto:a@example.com), [root](/code/main.go)",
		"![image](../code/main.go \"title\"), [ref][r], `[in code](nowhere.md)`",
		"[`main`](../code/main.go), [`x.main`, `main.go`](../code/main.go#L3), [`main`](target.md)",
		"",
		"[r]: target.md#relay-and-publish",
		"",
		"```mermaid",
		"flowchart LR",
		"    a --> b",
		"```",
		"",
		"```go",
		"x := \"[not](a-link.md)\"",
		"```",
		"",
		"```go",
		"func f() {}",
		"```",
	}, "\n"))
	write("docs/bad.md", strings.Join([]string{
		"# Bad",
		"[missing file](nowhere.md)",
		"[missing anchor](target.md#no-such-heading)",
		"[missing self anchor](#nope)",
		"[heading in code](target.md#not-a-heading)",
		"[line past the end](../code/main.go#L99)",
		"[outside](../../elsewhere.md)",
		"[ref][r]",
		"[`Main`, `pkg.Gone`](../code/main.go)",
		"[r]: gone.md",
		"",
		"```mermaid",
		"```",
		"",
		"```",
		"sequenceDiagram",
		"    a->>b: hi",
		"```",
		"",
		"```mermaid",
		"sequencediagram",
		"```",
		"",
		"```mermaid",
		"sequenceDiagram",
		"    a->>b: BEGIN; COMMIT",
		"    a->>b: escaped #59; fine",
		"```",
		"",
		"```go",
		"if x := ; {",
		"```",
		"",
		"```mermaid",
		"graph TD",
	}, "\n"))

	c := newChecker(root)
	if p := c.check("docs/good.md"); len(p) > 0 {
		t.Errorf("good.md: want no problems, got:\n%s", strings.Join(p, "\n"))
	}
	if p := c.check("docs/target.md"); len(p) > 0 {
		t.Errorf("target.md: want no problems, got:\n%s", strings.Join(p, "\n"))
	}
	problems := c.check("docs/bad.md")
	got := strings.Join(problems, "\n")
	wants := []string{
		"bad.md:2: nowhere.md: no such file",
		"bad.md:3: target.md#no-such-heading: no heading",
		"bad.md:4: #nope: no heading",
		"bad.md:5: target.md#not-a-heading: no heading",
		"bad.md:6: ../code/main.go#L99: the file has 3 lines",
		"bad.md:7: ../../elsewhere.md: outside the repository",
		"bad.md:9: ../code/main.go: names Main, which does not occur there",
		"bad.md:9: ../code/main.go: names pkg.Gone, which does not occur there",
		"bad.md:10: gone.md: no such file",
		"bad.md:12: an empty mermaid block",
		"bad.md:15: a mermaid diagram (sequenceDiagram) fenced as ```",
		"bad.md:20: a mermaid block that starts with \"sequencediagram\"",
		"bad.md:26: a ; in a sequenceDiagram ends the statement",
		"bad.md:30: a go block that does not parse",
		"bad.md:34: a code block that is never closed",
	}
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("bad.md: want a problem %q, got:\n%s", want, got)
		}
	}
	if len(problems) != len(wants) {
		t.Errorf("bad.md: want %d problems, got %d:\n%s", len(wants), len(problems), got)
	}
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Run it":                                        "run-it",
		"Use it as a template":                          "use-it-as-a-template",
		"The `message_outbox` row":                      "the-message_outbox-row",
		"Relay and publish":                             "relay-and-publish",
		"Operations: replay, repair":                    "operations-replay-repair",
		"What can go wrong, and why?":                   "what-can-go-wrong-and-why",
		"Latency: NOTIFY, with polling as the fallback": "latency-notify-with-polling-as-the-fallback",
		"[Linked](x.md) *heading*":                      "linked-heading",
		"Figures (2026-11-30, 2 cores)":                 "figures-2026-11-30-2-cores",
		"Ünïcode stays":                                 "ünïcode-stays",
		"Closing hashes ##":                             "closing-hashes",
	} {
		if got := slug(headingText(heading)); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// markdownFiles lists the repository's *.md files, slash-separated and
// relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && file != root && slices.Contains(skipDirs, d.Name()) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.EqualFold(filepath.Ext(file), ".md") {
			rel, err := filepath.Rel(root, file)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checker checks Markdown files below root, reading each link target's
// headings once.
type checker struct {
	root    string
	anchors map[string][]string // file (slash, relative to root) -> its anchors
}

func newChecker(root string) *checker {
	return &checker{root: root, anchors: map[string][]string{}}
}

var (
	// inlineLink is [text](target) or ![alt](target "title"); the text may
	// hold one level of brackets.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	// codeLink is a link whose text is code only, such as
	// [`MoveOrder`](../internal/store/orders.go) or [`a`, `b`](file).
	codeLink = regexp.MustCompile("\\[((?:`[^`]+`(?:\\s*,\\s*)?)+)\\]\\(([^()\\s#]+)(?:#[^()\\s]*)?\\)")
	// codeSpanText is one code span of a code-only link's text.
	codeSpanText = regexp.MustCompile("`([^`]+)`")
	// identifier is a Go name, or Type.Method.
	identifier = regexp.MustCompile(`^[A-Za-z_]\w*(?:\.([A-Za-z_]\w*))?$`)
	// referenceDef is a reference-style link definition: [label]: target.
	referenceDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("^\\s{0,3}(`{3,}|~{3,})\\s*([^`\\s]*)")
	// atxHeading is "# heading", up to six #.
	atxHeading = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*$`)
	// htmlAnchor is <a name="x"> or an element with id="x".
	htmlAnchor = regexp.MustCompile(`<[a-zA-Z][^>]*\s(?:name|id)="([^"]+)"`)
	// entityCode is mermaid's escape of a character, such as #59; for ;.
	entityCode = regexp.MustCompile(`#\w+;`)
	// lineAnchor is GitHub's #L12 or #L12-L20 on a source file.
	lineAnchor = regexp.MustCompile(`^L(\d+)(?:-L(\d+))?$`)
)

// mermaidTypes are the diagram types a mermaid block may start with.
var mermaidTypes = []string{
	"flowchart", "graph", "sequenceDiagram", "stateDiagram", "stateDiagram-v2", "classDiagram",
	"erDiagram", "gantt", "pie", "journey", "gitGraph", "mindmap", "timeline", "quadrantChart",
	"requirementDiagram", "C4Context", "C4Container", "C4Component", "C4Dynamic", "C4Deployment",
	"sankey-beta", "xychart-beta", "block-beta", "architecture-beta", "packet-beta", "kanban",
}

// looksLikeMermaid reports whether the first line of a code block is that
// of a mermaid diagram: a diagram type alone, or flowchart/graph with a
// direction.
func looksLikeMermaid(first string) bool {
	f := strings.Fields(first)
	switch {
	case len(f) == 1:
		return slices.Contains(mermaidTypes, f[0])
	case len(f) == 2 && (f[0] == "flowchart" || f[0] == "graph"):
		return slices.Contains([]string{"TB", "TD", "BT", "RL", "LR"}, f[1])
	}
	return false
}

// stripCodeSpans removes inline code (text between two equal runs of
// backticks) from a line: a link inside it is text.
func stripCodeSpans(line string) string {
	var b strings.Builder
	for {
		start := strings.IndexByte(line, '`')
		if start < 0 {
			b.WriteString(line)
			return b.String()
		}
		n := start
		for n < len(line) && line[n] == '`' {
			n++
		}
		ticks := line[start:n]
		end := -1
		for i := n; i < len(line); {
			j := strings.Index(line[i:], ticks)
			if j < 0 {
				break
			}
			j += i
			k := j + len(ticks)
			if k < len(line) && line[k] == '`' { // a longer run: not the closer
				for k < len(line) && line[k] == '`' {
					k++
				}
				i = k
				continue
			}
			end = k
			break
		}
		if end < 0 { // no closing run: the backticks are text
			b.WriteString(line[:n])
			line = line[n:]
			continue
		}
		b.WriteString(line[:start])
		line = line[end:]
	}
}

// block is a fenced code block.
type block struct {
	line  int      // the opening fence's line, 1-based
	info  string   // the info string: the language
	lines []string // the content
}

// parse splits a Markdown file into the lines outside fenced code blocks
// (code lines blanked, so that line numbers stay right) and the blocks; a
// block left open is reported as a problem.
func parse(text string) (prose []string, blocks []block, problems []string) {
	lines := strings.Split(text, "\n")
	var open *block
	var marker string
	for i, line := range lines {
		if open != nil {
			m := fence.FindStringSubmatch(line)
			if m != nil && m[1][0] == marker[0] && len(m[1]) >= len(marker) && m[2] == "" {
				blocks = append(blocks, *open)
				open = nil
			} else {
				open.lines = append(open.lines, line)
			}
			prose = append(prose, "")
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			open = &block{line: i + 1, info: m[2]}
			marker = m[1]
			prose = append(prose, "")
			continue
		}
		prose = append(prose, line)
	}
	if open != nil {
		problems = append(problems, fmt.Sprintf("%d: a code block that is never closed", open.line))
	}
	return prose, blocks, problems
}

// check returns the problems of one file (slash path relative to root).
func (c *checker) check(file string) []string {
	raw, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(file)))
	if err != nil {
		return []string{err.Error()}
	}
	prose, blocks, problems := parse(string(raw))
	for i := range problems {
		problems[i] = file + ":" + problems[i]
	}
	report := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
	}

	for i, line := range prose {
		for _, m := range codeLink.FindAllStringSubmatch(line, -1) {
			for _, name := range c.missingNames(file, m[1], m[2]) {
				report(i+1, "%s: names %s, which does not occur there", m[2], name)
			}
		}
		line = stripCodeSpans(line)
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := referenceDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			if msg := c.checkTarget(file, target); msg != "" {
				report(i+1, "%s: %s", target, msg)
			}
		}
	}

	for _, b := range blocks {
		first := ""
		for _, l := range b.lines {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "%%") && l != "---" {
				first = l
				break
			}
		}
		kind, _, _ := strings.Cut(first, " ")
		switch {
		case b.info == "mermaid" && first == "":
			report(b.line, "an empty mermaid block")
		case b.info == "mermaid" && !slices.Contains(mermaidTypes, kind):
			report(b.line, "a mermaid block that starts with %q, not a diagram type", first)
		case b.info != "mermaid" && looksLikeMermaid(first):
			report(b.line, "a mermaid diagram (%s) fenced as ```%s: GitHub renders only ```mermaid", first, b.info)
		}
		if b.info == "go" {
			if err := parsesAsGo(strings.Join(b.lines, "\n")); err != nil {
				report(b.line, "a go block that does not parse: %v", err)
			}
		}
		if b.info == "mermaid" && kind == "sequenceDiagram" {
			for j, l := range b.lines {
				if strings.Contains(entityCode.ReplaceAllString(l, ""), ";") {
					report(b.line+1+j, "a ; in a sequenceDiagram ends the statement there: write #59; or rephrase")
				}
			}
		}
	}
	return problems
}

// parsesAsGo reports whether code parses as Go: as a file's declarations
// (with its package clause or without), or as the statements of a function
// body. Examples in the docs are snippets, so names need not resolve; a
// snippet that does not even parse has drifted or was never Go.
func parsesAsGo(code string) error {
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", code, parser.SkipObjectResolution); err == nil {
		return nil
	}
	if _, err := parser.ParseFile(fset, "", "package p\n"+code, parser.SkipObjectResolution); err == nil {
		return nil
	}
	_, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+code+"\n}", parser.SkipObjectResolution)
	return err
}

// checkTarget says what is wrong with a link from file to target, or "".
func (c *checker) checkTarget(file, target string) string {
	if target == "" {
		return "an empty link"
	}
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return "" // http(s), mailto: not checked
	}
	pathPart, anchor, _ := strings.Cut(target, "#")
	pathPart, err := url.PathUnescape(pathPart)
	if err != nil {
		return "not a valid path: " + err.Error()
	}
	var dest string // slash path relative to root
	switch {
	case pathPart == "":
		dest = file
	case strings.HasPrefix(pathPart, "/"):
		dest = path.Clean(strings.TrimPrefix(pathPart, "/"))
	default:
		dest = path.Join(path.Dir(file), pathPart)
	}
	if dest == ".." || strings.HasPrefix(dest, "../") {
		return "outside the repository"
	}
	info, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(dest)))
	if err != nil {
		return "no such file"
	}
	if anchor == "" {
		return ""
	}
	if info.IsDir() {
		return "an anchor on a directory"
	}
	if !strings.EqualFold(filepath.Ext(dest), ".md") {
		m := lineAnchor.FindStringSubmatch(anchor)
		if m == nil {
			return "an anchor on a file that is not Markdown (only #L<line> works there)"
		}
		raw, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(dest)))
		if err != nil {
			return err.Error()
		}
		n := strings.Count(string(raw), "\n")
		if !strings.HasSuffix(string(raw), "\n") {
			n++
		}
		for _, l := range m[1:] {
			if l == "" {
				continue
			}
			if v, _ := strconv.Atoi(l); v < 1 || v > n {
				return fmt.Sprintf("the file has %d lines", n)
			}
		}
		return ""
	}
	anchors, err := c.anchorsOf(dest)
	if err != nil {
		return err.Error()
	}
	if !slices.Contains(anchors, anchor) {
		return fmt.Sprintf("no heading of %s has this anchor (anchors are lower case; it has %v)", dest, anchors)
	}
	return ""
}

// missingNames returns the Go names of a code-only link's text (a name, or
// the method of Type.Method) that the linked source file does not contain:
// the code was renamed or moved, and the link points at nothing.
func (c *checker) missingNames(file, text, target string) []string {
	if u, err := url.Parse(target); err != nil || u.Scheme != "" || strings.HasPrefix(target, "/") {
		return nil
	}
	dest := filepath.Join(c.root, filepath.FromSlash(path.Join(path.Dir(file), target)))
	info, err := os.Stat(dest)
	if err != nil || info.IsDir() || strings.EqualFold(filepath.Ext(dest), ".md") {
		return nil // a missing file is reported as a broken link
	}
	raw, err := os.ReadFile(dest)
	if err != nil {
		return nil
	}
	var missing []string
	for _, m := range codeSpanText.FindAllStringSubmatch(text, -1) {
		id := identifier.FindStringSubmatch(m[1])
		if id == nil || strings.HasSuffix(target, m[1]) {
			continue // a command, or the file's own name: not a name to look for
		}
		name := m[1]
		if id[1] != "" {
			name = id[1]
		}
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).Match(raw) {
			missing = append(missing, m[1])
		}
	}
	return missing
}

// anchorsOf returns the anchors GitHub gives the headings of a Markdown
// file (a repeated heading gets -1, -2, ...), and those of HTML name and id
// attributes.
func (c *checker) anchorsOf(file string) ([]string, error) {
	if a, ok := c.anchors[file]; ok {
		return a, nil
	}
	raw, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	prose, _, _ := parse(string(raw))
	var anchors []string
	seen := map[string]int{}
	add := func(heading string) {
		s := slug(headingText(heading))
		if n := seen[s]; n > 0 {
			anchors = append(anchors, fmt.Sprintf("%s-%d", s, n))
		} else {
			anchors = append(anchors, s)
		}
		seen[s]++
	}
	for i, line := range prose {
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			add(m[2])
		} else if i > 0 && isSetextUnderline(line) && isParagraphLine(prose[i-1]) {
			add(strings.TrimSpace(prose[i-1]))
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors = append(anchors, m[1])
		}
	}
	c.anchors[file] = anchors
	return anchors, nil
}

func isSetextUnderline(line string) bool {
	l := strings.TrimSpace(line)
	return l != "" && (strings.Trim(l, "=") == "" || strings.Trim(l, "-") == "")
}

func isParagraphLine(line string) bool {
	l := strings.TrimSpace(line)
	return l != "" && !strings.ContainsAny(l[:1], "|-*+>#") && !atxHeading.MatchString(l)
}

var (
	closingHashes = regexp.MustCompile(`\s+#+\s*$`)
	linkInHeading = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// headingText is the text of a heading as GitHub renders it: without a
// closing run of #, link targets, code and emphasis markers.
func headingText(h string) string {
	h = closingHashes.ReplaceAllString(h, "")
	h = linkInHeading.ReplaceAllString(h, "$1")
	return strings.NewReplacer("`", "", "*", "").Replace(h)
}

// slug is GitHub's anchor for a heading's text: lower case; letters,
// digits, spaces, - and _ kept and everything else dropped; each space
// turned into -.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
