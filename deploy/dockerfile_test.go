package deploy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/yourorg/orders/internal/testenv"
)

// The Dockerfile is read as text: the few instructions these checks need
// are simple to parse, and no Docker engine or BuildKit is at hand. Like the
// compose checks, each check is a function over the text so that
// TestDockerfileChecks can prove it fails.

func TestDockerfile(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(t)
	text := readRepoFile(t, "Dockerfile")
	reportProblems(t, dockerfileProblems(parseDockerfile(text), goDirective(t, root), repoCommands(t)))
	reportProblems(t, frontendProblems(text))
}

// directive is a parser directive: `# key=value` in the lines at the top
// of a Dockerfile, before any other comment, empty line or instruction.
var directive = regexp.MustCompile(`^#\s*([A-Za-z]+)\s*=\s*(.*?)\s*$`)

// frontendProblems reports a `# syntax=` directive. It makes every build
// fetch that Dockerfile frontend image from a registry before reading the
// file, so builds fail offline, behind a proxy or during a registry
// outage; the Dockerfile uses only what BuildKit's built-in frontend has.
// A team that needs a newer frontend feature pins the frontend by digest
// and changes this check.
func frontendProblems(text string) []string {
	for line := range strings.Lines(text) {
		m := directive.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
		if m == nil {
			break
		}
		if strings.EqualFold(m[1], "syntax") {
			return []string{fmt.Sprintf("parser directive `# syntax=%s`: every build would first fetch that frontend from a registry; use the built-in one (say why in the Dockerfile if a feature needs another)", m[2])}
		}
	}
	return nil
}

func TestComposeEntrypointsAreInTheImage(t *testing.T) {
	t.Parallel()
	installed := installedBinaries(parseDockerfile(readRepoFile(t, "Dockerfile")), repoCommands(t))
	checkStacks(t, func(p *types.Project) []string { return missingEntrypoints(p, installed) })
}

// missingEntrypoints lists the services running the image of the
// Dockerfile whose entrypoint is not a path where the image has a binary:
// such a service fails only when it starts. installed is
// installedBinaries' result.
func missingEntrypoints(p *types.Project, installed map[string]string) []string {
	var problems []string
	paths := slices.Sorted(maps.Values(installed))
	for _, name := range serviceNames(p) {
		svc := p.Services[name]
		if !runsRepositoryImage(p, svc) || len(svc.Entrypoint) == 0 {
			continue
		}
		if !slices.Contains(paths, svc.Entrypoint[0]) {
			problems = append(problems, fmt.Sprintf("service %s: entrypoint %q is not a binary the Dockerfile installs (%v)", name, svc.Entrypoint[0], paths))
		}
	}
	return problems
}

func TestDockerignore(t *testing.T) {
	t.Parallel()
	root := testenv.RepoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatalf(".dockerignore: %v: without it every build sends .git and local binaries to the daemon", err)
	}
	patterns, err := ignorefile.ReadAll(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	excluded := append([]string{".git/HEAD"}, localBuildOutputs(t, root, repoCommands(t))...)
	kept := append([]string{"go.mod", "go.sum"}, buildInputs(t, root)...)
	reportProblems(t, dockerignoreProblems(patterns, excluded, kept))
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

var goLine = regexp.MustCompile(`(?m)^go\s+(\d+\.\d+)`)

// goDirective returns the major.minor of go.mod's go directive.
func goDirective(t *testing.T, root string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := goLine.FindSubmatch(raw)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// dockerInstruction is one instruction, its continuation lines joined.
type dockerInstruction struct {
	keyword string // upper case
	args    string
}

// buildStage is one FROM and the instructions up to the next.
type buildStage struct {
	base, name   string // the FROM image (global ARGs expanded) and AS name
	instructions []dockerInstruction
}

// parseDockerfile splits a Dockerfile into stages. Comment and empty lines
// are dropped even inside a continuation, as Docker does; heredocs are not
// understood (none is needed).
func parseDockerfile(text string) []buildStage {
	var logical []string
	var cur strings.Builder
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if body, more := strings.CutSuffix(line, `\`); more {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	globals := map[string]string{}
	var stages []buildStage
	for _, l := range logical {
		keyword, args, _ := strings.Cut(l, " ")
		in := dockerInstruction{keyword: strings.ToUpper(keyword), args: strings.TrimSpace(args)}
		switch {
		case in.keyword == "FROM":
			fields := slices.DeleteFunc(strings.Fields(in.args), func(f string) bool { return strings.HasPrefix(f, "--") })
			s := buildStage{}
			if len(fields) > 0 {
				s.base = os.Expand(fields[0], func(k string) string { return globals[k] })
			}
			if len(fields) >= 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
		case len(stages) == 0 && in.keyword == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			globals[k] = strings.Trim(v, `"'`)
		case len(stages) > 0:
			stages[len(stages)-1].instructions = append(stages[len(stages)-1].instructions, in)
		}
	}
	return stages
}

// stageIndex finds a stage by its AS name or number, as FROM and
// COPY --from refer to it; -1 when ref is an image.
func stageIndex(stages []buildStage, ref string) int {
	for i, s := range stages {
		if s.name != "" && strings.EqualFold(s.name, ref) {
			return i
		}
	}
	if i, err := strconv.Atoi(ref); err == nil && i >= 0 && i < len(stages) {
		return i
	}
	return -1
}

// ancestry returns a stage and the stages it is built FROM, nearest first.
func ancestry(stages []buildStage, i int) []buildStage {
	var chain []buildStage
	for i >= 0 && len(chain) <= len(stages) {
		chain = append(chain, stages[i])
		i = stageIndex(stages[:i], stages[i].base)
	}
	return chain
}

// baseImage is the image a stage ultimately starts from.
func baseImage(stages []buildStage, i int) string {
	chain := ancestry(stages, i)
	return chain[len(chain)-1].base
}

// goBuildCmd is one `go build` of a RUN instruction.
type goBuildCmd struct {
	run      string   // its command line, to look for its environment
	out      string   // -o, resolved against WORKDIR; a trailing / means a directory
	packages []string // ./cmd/order-api, ./cmd/..., ./lab/...
}

// goCommands are the ways a shell line or a Makefile names the go tool.
var goCommands = []string{"go", "$(GO)", "${GO}", "$GO"}

// goBuilds finds the `go build` commands in shell text, one command a line
// (continuations already joined).
func goBuilds(run, workdir string) []goBuildCmd {
	var builds []goBuildCmd
	for line := range strings.Lines(run) {
		builds = append(builds, goBuildsOfLine(line, workdir)...)
	}
	return builds
}

func goBuildsOfLine(run, workdir string) []goBuildCmd {
	var builds []goBuildCmd
	fields := strings.Fields(run)
	for i := 0; i+1 < len(fields); i++ {
		if !slices.Contains(goCommands, fields[i]) || fields[i+1] != "build" {
			continue
		}
		b := goBuildCmd{run: run}
	args:
		for j := i + 2; j < len(fields); j++ {
			f := fields[j]
			switch {
			case f == "&&" || f == "||" || f == ";" || f == "|" || strings.HasSuffix(f, ";"):
				break args
			case f == "-o" && j+1 < len(fields):
				j++
				b.out = fields[j]
			case strings.HasPrefix(f, "-o="):
				b.out = f[len("-o="):]
			case strings.HasPrefix(f, "-"):
			default:
				b.packages = append(b.packages, f)
			}
		}
		if b.out != "" && !path.IsAbs(b.out) && workdir != "" {
			dir := strings.HasSuffix(b.out, "/")
			b.out = path.Join(workdir, b.out)
			if dir {
				b.out += "/"
			}
		}
		builds = append(builds, b)
	}
	return builds
}

// stageBuilds returns the go builds of a stage, each with its WORKDIR.
func stageBuilds(s buildStage) []goBuildCmd {
	var builds []goBuildCmd
	workdir := "/"
	for _, in := range s.instructions {
		switch in.keyword {
		case "WORKDIR":
			workdir = path.Join(workdir, in.args)
		case "RUN":
			builds = append(builds, goBuilds(in.args, workdir)...)
		}
	}
	return builds
}

// builds tells whether a go build builds the command in folder (relative
// to the root: cmd/order-api, lab/walkthrough): it names the folder
// (./cmd/order-api, or a path ending in /cmd/order-api), or a pattern
// over a folder above it (./cmd/..., ./lab/..., ./...).
func (b goBuildCmd) builds(folder string) bool {
	names := func(pkg, dir string) bool { return pkg == "./"+dir || strings.HasSuffix(pkg, "/"+dir) }
	for _, pkg := range b.packages {
		if names(pkg, folder) || pkg == "./..." {
			return true
		}
		above, ok := strings.CutSuffix(pkg, "/...")
		for dir := path.Dir(folder); ok && dir != "."; dir = path.Dir(dir) {
			if names(above, dir) {
				return true
			}
		}
	}
	return false
}

// outputs maps each command (its folder) a go build writes to the path of
// its binary in the stage. A build without -o writes nothing for several
// packages and a file in the WORKDIR for one: the checks ask for -o rather
// than guess.
func (b goBuildCmd) outputs(commands []string) map[string]string {
	out := map[string]string{}
	for _, cmd := range commands {
		switch {
		case !b.builds(cmd) || b.out == "":
		case strings.HasSuffix(b.out, "/"):
			out[cmd] = b.out + commandName(cmd)
		case len(b.packages) == 1:
			out[cmd] = b.out
		}
	}
	return out
}

// copySources parses the sources and destination of a COPY, and its --from.
func copySources(args string) (from string, sources []string, dest string) {
	fields := strings.Fields(args)
	for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
		if v, ok := strings.CutPrefix(fields[0], "--from="); ok {
			from = v
		}
		fields = fields[1:]
	}
	if rest := strings.Join(fields, " "); strings.HasPrefix(rest, "[") {
		var list []string
		if json.Unmarshal([]byte(rest), &list) == nil {
			fields = list
		}
	}
	if len(fields) < 2 {
		return from, nil, ""
	}
	return from, fields[:len(fields)-1], fields[len(fields)-1]
}

// installedBinaries maps each command (its folder, cmd/order-api) to the
// path of its binary in the final image: built with -o in some stage, then
// copied by the final stage from that stage.
func installedBinaries(stages []buildStage, commands []string) map[string]string {
	installed := map[string]string{}
	if len(stages) == 0 {
		return installed
	}
	final := stages[len(stages)-1]
	for _, in := range final.instructions {
		if in.keyword != "COPY" {
			continue
		}
		from, sources, dest := copySources(in.args)
		i := stageIndex(stages[:len(stages)-1], from)
		if i < 0 {
			continue
		}
		for _, b := range stageBuilds(stages[i]) {
			for bin, built := range b.outputs(commands) {
				for _, src := range sources {
					src = path.Join("/", src)
					switch {
					case built == src:
						if strings.HasSuffix(dest, "/") || len(sources) > 1 {
							installed[bin] = path.Join(dest, path.Base(built))
						} else {
							installed[bin] = dest
						}
					case strings.HasPrefix(built, strings.TrimSuffix(src, "/")+"/"):
						installed[bin] = path.Join(dest, strings.TrimPrefix(built, strings.TrimSuffix(src, "/")+"/"))
					default:
						if ok, _ := path.Match(src, built); ok {
							installed[bin] = path.Join(dest, path.Base(built))
						}
					}
				}
			}
		}
	}
	return installed
}

var (
	cgoOff = regexp.MustCompile(`\bCGO_ENABLED[= ]["']?0\b`)
	// goVersionTag is the Go release a golang image tag names: 1.26,
	// 1.26.8, 1.26rc1, each optionally followed by -variant.
	goVersionTag = regexp.MustCompile(`^(\d+\.\d+)(\.\d+|rc\d+)?(-|$)`)
)

// nonRootUser tells whether a USER runs without root: a non-zero uid or
// one of the unprivileged accounts of distroless's /etc/passwd.
func nonRootUser(user string) bool {
	name, _, _ := strings.Cut(user, ":")
	if uid, err := strconv.Atoi(name); err == nil {
		return uid != 0
	}
	return name == "nonroot" || name == "nobody"
}

// dockerfileProblems checks the conventions of a Go service image: build
// with the Go of go.mod in one stage; ship static binaries, without the
// builder's paths, in a distroless final stage that does not run as root;
// and ship every command (commands: their folders, cmd/order-api and
// lab/walkthrough: compose runs some of the lab's too).
func dockerfileProblems(stages []buildStage, goVersion string, commands []string) []string {
	var problems []string
	if len(stages) < 2 {
		problems = append(problems, fmt.Sprintf("%d stage(s): build in one stage and copy the binaries into a small final one, or the image ships the Go toolchain and the sources", len(stages)))
	}
	var builds []goBuildCmd
	for i, s := range stages {
		own := stageBuilds(s)
		if len(own) == 0 {
			continue
		}
		builds = append(builds, own...)
		image := baseImage(stages, i)
		repo, tag, _ := imageParts(image)
		if m := goVersionTag.FindStringSubmatch(tag); path.Base(repo) != "golang" || m == nil || m[1] != goVersion {
			problems = append(problems, fmt.Sprintf("stage %q builds FROM %s: want golang:%s (go.mod's go directive), its version in the tag", cmp.Or(s.name, strconv.Itoa(i)), image, goVersion))
		}
		var env strings.Builder
		for _, a := range ancestry(stages, i) {
			for _, in := range a.instructions {
				if in.keyword == "ENV" {
					env.WriteString(in.args + "\n")
				}
			}
		}
		for _, b := range own {
			if !cgoOff.MatchString(b.run) && !cgoOff.MatchString(env.String()) {
				problems = append(problems, fmt.Sprintf("go build without CGO_ENABLED=0: %q; a cgo binary needs a libc the distroless static image does not have", b.run))
			}
			if !strings.Contains(b.run, "-trimpath") && !strings.Contains(env.String(), "-trimpath") {
				problems = append(problems, fmt.Sprintf("go build without -trimpath: %q; the binaries would carry the builder's file paths", b.run))
			}
		}
	}
	if len(builds) == 0 {
		problems = append(problems, "no RUN go build: the image does not build the commands")
	}

	if len(stages) > 0 {
		last := len(stages) - 1
		image := baseImage(stages, last)
		repo, tag, _ := imageParts(image)
		if !strings.HasPrefix(repo, "gcr.io/distroless/static") {
			problems = append(problems, fmt.Sprintf("final stage FROM %s: want gcr.io/distroless/static* (no shell, no package manager, no libc the static binaries would not use)", image))
		}
		if strings.Contains(tag, "debug") {
			problems = append(problems, fmt.Sprintf("final stage FROM %s: a debug image carries a shell", image))
		}
		user := ""
		if strings.Contains(tag, "nonroot") {
			user = "nonroot"
		}
		for _, a := range slices.Backward(ancestry(stages, last)) {
			for _, in := range a.instructions {
				if in.keyword == "USER" {
					user = in.args
				}
			}
		}
		if !nonRootUser(user) {
			problems = append(problems, fmt.Sprintf("final stage runs as %s: use the :nonroot tag or USER nonroot (or a non-zero uid)", cmp.Or(user, "root")))
		}
	}

	installed := installedBinaries(stages, commands)
	for _, cmd := range commands {
		built := slices.ContainsFunc(builds, func(b goBuildCmd) bool { return b.builds(cmd) })
		switch _, ok := installed[cmd]; {
		case !built:
			problems = append(problems, fmt.Sprintf("%s is not built: no go build names ./%s (or ./%s/...)", cmd, cmd, path.Dir(cmd)))
		case !ok:
			problems = append(problems, fmt.Sprintf("%s is built but not copied into the final stage (go build -o, then COPY --from of that path)", cmd))
		}
	}
	return problems
}

// assignment is a shell (NAME=value, export NAME=value) or Makefile
// (NAME := value, ?=, =) variable assignment.
var assignment = regexp.MustCompile(`(?m)^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?::=|\?=|=)(.*)$`)

// defaultValue reads the default of ${VAR:-default}, the value a script
// uses when the caller sets nothing.
var defaultValue = regexp.MustCompile(`^\$\{[A-Za-z_][A-Za-z0-9_]*:-(.*)\}$`)

// makeVariable is a Makefile reference, $(NAME).
var makeVariable = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// localBuildOutputs returns what the Makefile and scripts/ build of
// commands (their folders) into the working tree (bin/order-api, ...), for
// .dockerignore to keep out of the build context. Variables are expanded
// with the defaults the files give them (bin="${DEV_BIN:-bin}"), as a
// plain run would.
func localBuildOutputs(t *testing.T, root string, commands []string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "scripts", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var outputs []string
	for _, file := range append(files, filepath.Join(root, "Makefile")) {
		raw, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		text := strings.NewReplacer("\\\n", " ", `"`, "", "'", "").Replace(string(raw))
		text = makeVariable.ReplaceAllString(text, "$${$1}")
		vars := map[string]string{}
		for _, m := range assignment.FindAllStringSubmatch(text, -1) {
			v := strings.TrimSpace(m[2])
			if d := defaultValue.FindStringSubmatch(v); d != nil {
				v = d[1]
			}
			vars[m[1]] = v
		}
		text = os.Expand(text, func(k string) string {
			if v, ok := vars[k]; ok {
				return v
			}
			return "$" + k
		})
		for _, b := range goBuilds(text, "") {
			for _, out := range b.outputs(commands) {
				if !path.IsAbs(out) {
					outputs = append(outputs, path.Clean(out))
				}
			}
		}
	}
	if len(outputs) == 0 {
		t.Fatal("no `go build -o` in the Makefile or scripts/: which local build directory must .dockerignore exclude?")
	}
	slices.Sort(outputs)
	return slices.Compact(outputs)
}

// buildInputs returns the files of this module that the image's build of
// the commands (repoCommands) reads, relative to the root: the Go files and
// the go:embed'ed ones of every package of the module they import.
func buildInputs(t *testing.T, root string) []string {
	t.Helper()
	args := []string{"list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module"}
	for _, c := range repoCommands(t) {
		args = append(args, "./"+c)
	}
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var files []string
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var pkg struct {
			Dir                 string
			GoFiles, EmbedFiles []string
			Module              *struct{ Main bool }
		}
		if err := dec.Decode(&pkg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if pkg.Module == nil || !pkg.Module.Main {
			continue
		}
		for _, f := range slices.Concat(pkg.GoFiles, pkg.EmbedFiles) {
			rel, err := filepath.Rel(root, filepath.Join(pkg.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, filepath.ToSlash(rel))
		}
	}
	if len(files) == 0 {
		t.Fatal("go list found no file of the module")
	}
	return files
}

// dockerignoreProblems checks .dockerignore's patterns: the excluded paths
// (.git, local build output) would go to the daemon on every build and
// change the COPY . . layer with every commit or local build; a kept path
// excluded breaks the image build (an embedded migration, a Go file).
func dockerignoreProblems(patterns, excluded, kept []string) []string {
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return []string{fmt.Sprintf(".dockerignore: %v", err)}
	}
	var problems []string
	for _, p := range excluded {
		if ok, err := pm.MatchesOrParentMatches(p); err != nil || !ok {
			problems = append(problems, fmt.Sprintf(".dockerignore does not exclude %s: it would enter the build context and bust the COPY . . cache", p))
		}
	}
	for _, p := range kept {
		if ok, err := pm.MatchesOrParentMatches(p); err != nil || ok {
			problems = append(problems, fmt.Sprintf(".dockerignore excludes %s, which the image build reads", p))
		}
	}
	return problems
}

// goodDockerfile passes every check; each case of TestDockerfileChecks
// breaks one thing in it (or changes it in a way that must still pass).
const goodDockerfile = `ARG GO_VERSION=1.26.8
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Static binaries.
RUN CGO_ENABLED=0 \
    go build -trimpath -ldflags="-s -w" -o /out/ \
        ./cmd/order-api ./cmd/outbox-relay ./lab/walkthrough
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/order-api"]
`

// dockerfileBinaries are the commands the checks want built: two of the
// service's, one of the lab's.
var dockerfileBinaries = []string{"cmd/order-api", "cmd/outbox-relay", "lab/walkthrough"}

// editDockerfile applies edits (old, new) to goodDockerfile, failing when
// an old text is not there: a case that edits nothing would prove nothing.
func editDockerfile(t *testing.T, edits [][2]string) string {
	t.Helper()
	text := goodDockerfile
	for _, e := range edits {
		if !strings.Contains(text, e[0]) {
			t.Fatalf("the Dockerfile has no %q to replace", e[0])
		}
		text = strings.Replace(text, e[0], e[1], 1)
	}
	return text
}

func TestDockerfileChecks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		edits [][2]string
		want  []string // each in some problem; none: no problem at all
	}{
		{name: "conventional"},
		{name: "one stage", edits: [][2]string{{"FROM gcr.io/distroless/static-debian12:nonroot\nCOPY --from=build /out/ /usr/local/bin/\n", ""}}, want: []string{"1 stage(s)", "final stage FROM golang:1.26.8-bookworm"}},
		{name: "older Go", edits: [][2]string{{"GO_VERSION=1.26.8", "GO_VERSION=1.25.3"}}, want: []string{`stage "build" builds FROM golang:1.25.3-bookworm: want golang:1.26`}},
		{name: "Go 1.2 is not 1.26", edits: [][2]string{{"GO_VERSION=1.26.8", "GO_VERSION=1.2"}}, want: []string{"want golang:1.26"}},
		{name: "Go version not in the tag", edits: [][2]string{{"golang:${GO_VERSION}-bookworm", "golang:bookworm"}}, want: []string{"builds FROM golang:bookworm"}},
		{name: "not a Go image", edits: [][2]string{{"golang:${GO_VERSION}-bookworm", "debian:12"}}, want: []string{"builds FROM debian:12"}},
		{name: "Go minor only", edits: [][2]string{{"golang:${GO_VERSION}-bookworm", "golang:1.26-alpine"}}},
		{name: "build in a stage FROM the Go stage", edits: [][2]string{{"WORKDIR /src", "FROM build AS compile\nWORKDIR /src"}, {"--from=build", "--from=compile"}}},
		{name: "cgo on", edits: [][2]string{{"CGO_ENABLED=0", "CGO_ENABLED=1"}}, want: []string{"without CGO_ENABLED=0"}},
		{name: "cgo unset", edits: [][2]string{{"CGO_ENABLED=0 ", ""}}, want: []string{"without CGO_ENABLED=0"}},
		{name: "cgo off in ENV", edits: [][2]string{{"RUN CGO_ENABLED=0 ", "ENV CGO_ENABLED=0\nRUN "}}},
		{name: "no trimpath", edits: [][2]string{{"-trimpath ", ""}}, want: []string{"without -trimpath"}},
		{name: "final alpine", edits: [][2]string{{"gcr.io/distroless/static-debian12:nonroot", "alpine:3.20"}}, want: []string{"final stage FROM alpine:3.20: want gcr.io/distroless/static"}},
		{name: "final distroless base", edits: [][2]string{{"distroless/static-debian12", "distroless/base-debian12"}}, want: []string{"want gcr.io/distroless/static"}},
		{name: "final debug", edits: [][2]string{{":nonroot", ":debug-nonroot"}}, want: []string{"a debug image carries a shell"}},
		{name: "user root", edits: [][2]string{{"USER nonroot:nonroot", "USER root"}}, want: []string{"final stage runs as root"}},
		{name: "user 0", edits: [][2]string{{"USER nonroot:nonroot", "USER 0:0"}}, want: []string{"final stage runs as 0:0"}},
		{name: "root by default", edits: [][2]string{{":nonroot", ":latest"}, {"USER nonroot:nonroot\n", ""}}, want: []string{"final stage runs as root"}},
		{name: "nonroot tag alone", edits: [][2]string{{"USER nonroot:nonroot\n", ""}}},
		{name: "numeric user", edits: [][2]string{{":nonroot", ""}, {"USER nonroot:nonroot", "USER 65532:65532"}}},
		{name: "binary not built", edits: [][2]string{{" ./cmd/outbox-relay", ""}}, want: []string{"cmd/outbox-relay is not built"}},
		{name: "lab command not built", edits: [][2]string{{" ./lab/walkthrough", ""}}, want: []string{"lab/walkthrough is not built: no go build names ./lab/walkthrough (or ./lab/...)"}},
		{name: "every command", edits: [][2]string{{"./cmd/order-api ./cmd/outbox-relay ./lab/walkthrough", "./cmd/... ./lab/..."}}},
		{name: "the service's commands only", edits: [][2]string{{"./cmd/order-api ./cmd/outbox-relay ./lab/walkthrough", "./cmd/..."}}, want: []string{"lab/walkthrough is not built"}},
		{name: "every package of the module", edits: [][2]string{{"./cmd/order-api ./cmd/outbox-relay ./lab/walkthrough", "./..."}}},
		{name: "a module path", edits: [][2]string{{"./cmd/order-api ./cmd/outbox-relay ./lab/walkthrough", "github.com/yourorg/orders/cmd/... github.com/yourorg/orders/lab/walkthrough"}}},
		{name: "a folder of the same name elsewhere", edits: [][2]string{{" ./lab/walkthrough", " ./cmd/walkthrough"}}, want: []string{"lab/walkthrough is not built"}},
		{name: "binary not copied", edits: [][2]string{{"COPY --from=build /out/ ", "COPY --from=build /out/order-api "}}, want: []string{"cmd/outbox-relay is built but not copied", "lab/walkthrough is built but not copied"}},
		{name: "copied from the wrong stage", edits: [][2]string{{"--from=build", "--from=golang:1.26"}}, want: []string{"cmd/order-api is built but not copied", "cmd/outbox-relay is built but not copied", "lab/walkthrough is built but not copied"}},
		{name: "no -o", edits: [][2]string{{"-o /out/ ", ""}}, want: []string{"cmd/order-api is built but not copied"}},
		{name: "no go build", edits: [][2]string{{"go build", "go vet"}}, want: []string{"no RUN go build", "cmd/order-api is not built"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := dockerfileProblems(parseDockerfile(editDockerfile(t, tt.edits)), "1.26", dockerfileBinaries)
			if len(tt.want) == 0 && len(got) > 0 {
				t.Fatalf("problems:\n%s", strings.Join(got, "\n"))
			}
			for _, want := range tt.want {
				if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, want) }) {
					t.Errorf("no problem contains %q; problems:\n%s", want, strings.Join(got, "\n"))
				}
			}
		})
	}
}

func TestFrontendProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, text string
		want       []string
	}{
		{"syntax directive", "# syntax=docker/dockerfile:1\nFROM scratch\n", []string{"`# syntax=docker/dockerfile:1`"}},
		{"pinned by digest", "#syntax = docker/dockerfile:1.7@sha256:0000\nFROM scratch\n", []string{"every build would first fetch"}},
		{"after another directive", "# escape=`\n# SYNTAX=docker/dockerfile:1\nFROM scratch\n", []string{"docker/dockerfile:1"}},
		{"none", "FROM scratch\n", nil},
		{"a comment first, then it is a comment", "# The image.\n# syntax=docker/dockerfile:1\nFROM scratch\n", nil},
		{"after an instruction", "FROM scratch\n# syntax=docker/dockerfile:1\n", nil},
		{"another directive", "# check=error=true\nFROM scratch\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wantProblems(t, frontendProblems(tt.text), tt.want)
		})
	}
}

func TestInstalledBinaries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		edits [][2]string
		want  map[string]string
	}{
		{name: "directory", want: map[string]string{"cmd/order-api": "/usr/local/bin/order-api", "cmd/outbox-relay": "/usr/local/bin/outbox-relay", "lab/walkthrough": "/usr/local/bin/walkthrough"}},
		{name: "files", edits: [][2]string{{"/out/ /usr/local/bin/", "/out/order-api /out/outbox-relay /usr/local/bin/"}}, want: map[string]string{"cmd/order-api": "/usr/local/bin/order-api", "cmd/outbox-relay": "/usr/local/bin/outbox-relay"}},
		{name: "renamed file", edits: [][2]string{{"/out/ /usr/local/bin/", "/out/order-api /app"}}, want: map[string]string{"cmd/order-api": "/app"}},
		{name: "glob", edits: [][2]string{{"/out/ /usr/local/bin/", "/out/order-* /bin/"}}, want: map[string]string{"cmd/order-api": "/bin/order-api"}},
		{name: "stage number and JSON form", edits: [][2]string{{"--from=build /out/ /usr/local/bin/", `--from=0 ["/out/", "/srv/"]`}}, want: map[string]string{"cmd/order-api": "/srv/order-api", "cmd/outbox-relay": "/srv/outbox-relay", "lab/walkthrough": "/srv/walkthrough"}},
		{name: "relative -o", edits: [][2]string{{"-o /out/", "-o bin/"}, {"COPY --from=build /out/", "COPY --from=build /src/bin/"}}, want: map[string]string{"cmd/order-api": "/usr/local/bin/order-api", "cmd/outbox-relay": "/usr/local/bin/outbox-relay", "lab/walkthrough": "/usr/local/bin/walkthrough"}},
		{name: "one package to a file", edits: [][2]string{{"-o /out/ ", "-o /out/api "}, {" ./cmd/outbox-relay ./lab/walkthrough", ""}}, want: map[string]string{"cmd/order-api": "/usr/local/bin/api"}},
		{name: "copied from elsewhere", edits: [][2]string{{"COPY --from=build /out/", "COPY --from=build /tmp/"}}, want: map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := installedBinaries(parseDockerfile(editDockerfile(t, tt.edits)), dockerfileBinaries)
			if !maps.Equal(got, tt.want) {
				t.Errorf("installed = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMissingEntrypoints(t *testing.T) {
	t.Parallel()
	installed := map[string]string{"order-api": "/usr/local/bin/order-api"}
	tests := []struct {
		name, entrypoint string
		want             int
	}{
		{"installed", "/usr/local/bin/order-api", 0},
		{"elsewhere", "/app/order-api", 1},
		{"not installed", "/usr/local/bin/outbox-relay", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := fmt.Sprintf("services:\n  app:\n    build: .\n    image: orders:dev\n    entrypoint: [%s]\n  same:\n    image: orders:dev\n    entrypoint: [%s]\n  other:\n    build: {context: ., dockerfile: other.Dockerfile}\n    entrypoint: [/elsewhere]\n", tt.entrypoint, tt.entrypoint)
			p, err := loadComposeDoc(t, doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			// app builds the image, same runs it: both are checked.
			if got := missingEntrypoints(p, installed); len(got) != 2*tt.want {
				t.Errorf("problems = %q, want %d", got, tt.want)
			}
		})
	}
}

func TestDockerignoreChecks(t *testing.T) {
	t.Parallel()
	excluded := []string{".git/HEAD", "bin/order-api"}
	kept := []string{"go.mod", "cmd/order-api/main.go", "api/openapi.yaml", "migrations/00001_init.sql"}
	tests := []struct {
		name, dockerignore string
		want               []string // a part of each problem, in order
	}{
		{name: "conventional", dockerignore: "# comment\n.git\n/bin/\ntest/\n**/*.test\n"},
		{name: "contents only", dockerignore: ".git/**\nbin/*\n"},
		{name: "no .git", dockerignore: "bin/\n", want: []string{"does not exclude .git/HEAD"}},
		{name: "no bin", dockerignore: ".git\n", want: []string{"does not exclude bin/order-api"}},
		{name: "bin let back in", dockerignore: ".git\nbin\n!bin/order-api\n", want: []string{"does not exclude bin/order-api"}},
		{name: "embedded file excluded", dockerignore: ".git\nbin\n**/*.yaml\n", want: []string{"excludes api/openapi.yaml"}},
		{name: "migrations excluded", dockerignore: ".git\nbin\nmigrations/\n", want: []string{"excludes migrations/00001_init.sql"}},
		{name: "everything but", dockerignore: "*\n!go.mod\n!cmd\n!api\n", want: []string{"excludes migrations/00001_init.sql"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			patterns, err := ignorefile.ReadAll(strings.NewReader(tt.dockerignore))
			if err != nil {
				t.Fatal(err)
			}
			wantProblems(t, dockerignoreProblems(patterns, excluded, kept), tt.want)
		})
	}
}

func TestLocalBuildOutputs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"script", map[string]string{"scripts/dev.sh": "go build -o bin/ ./cmd/order-api ./cmd/outbox-relay\n"}, []string{"bin/order-api", "bin/outbox-relay"}},
		{"script with a lab command", map[string]string{"scripts/dev.sh": "go build -o bin/ ./cmd/order-api ./lab/walkthrough\n"}, []string{"bin/order-api", "bin/walkthrough"}},
		{"script variable with default", map[string]string{"scripts/dev.sh": "bin=\"${DEV_BIN:-out}\"\nmkdir -p \"$bin\"\ngo build -o \"$bin/\" \\\n  ./cmd/...\n"}, []string{"out/order-api", "out/outbox-relay"}},
		{"Makefile", map[string]string{"Makefile": "GO ?= go\nBIN := build\nbuild:\n\t$(GO) build -o $(BIN)/api ./cmd/order-api\n"}, []string{"build/api"}},
		{"outside the tree", map[string]string{"scripts/dev.sh": "go build -o bin/ ./cmd/order-api\ngo build -o /tmp/x/ ./cmd/outbox-relay\n"}, []string{"bin/order-api"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for name, content := range tt.files {
				file := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := localBuildOutputs(t, root, dockerfileBinaries); !slices.Equal(got, tt.want) {
				t.Errorf("outputs = %q, want %q", got, tt.want)
			}
		})
	}
}
