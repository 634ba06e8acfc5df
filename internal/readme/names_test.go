package readme

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// names is what the docs may name: the exported names of the packages of
// this repository (every module) and of the libraries it plugs into.
type names struct {
	pkgs    map[string]map[string]bool // package name → its exported top-level names
	members map[string]map[string]bool // type name → its exported methods and fields
	all     map[string]bool            // every exported name, members included
	tests   map[string]bool            // the Test functions of the repository
	subs    map[string]bool            // the string literals of the test files (subtest names)
}

func newNames() *names {
	return &names{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{}, all: map[string]bool{}, tests: map[string]bool{}, subs: map[string]bool{}}
}

// hostModules are the libraries jobguard plugs into, whose names the docs
// use beside its own: the module that requires each (a directory of this
// repository) and the module's path.
var hostModules = [][2]string{
	{".", "github.com/hibiken/asynq"},
	{".", "github.com/robfig/cron/v3"},
	{".", "github.com/redis/go-redis/v9"},
	{"gocronguard", "github.com/go-co-op/gocron/v2"},
}

// add records the exported names declared in the Go file at path; tests
// says whether its Test functions count.
func (n *names) add(t *testing.T, fset *token.FileSet, path string, tests bool) {
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if tests {
		ast.Inspect(f, func(x ast.Node) bool {
			if lit, ok := x.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil {
					n.subs[v] = true
				}
			}
			return true
		})
	}
	pkg := strings.TrimSuffix(f.Name.Name, "_test")
	if n.pkgs[pkg] == nil {
		n.pkgs[pkg] = map[string]bool{}
	}
	member := func(typ, name string) {
		if !ast.IsExported(name) {
			return
		}
		if n.members[typ] == nil {
			n.members[typ] = map[string]bool{}
		}
		n.members[typ][name] = true
		n.all[name] = true
	}
	top := func(name string) {
		if ast.IsExported(name) {
			n.pkgs[pkg][name] = true
			n.all[name] = true
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				if tests && strings.HasPrefix(d.Name.Name, "Test") {
					n.tests[d.Name.Name] = true
				}
				top(d.Name.Name)
				continue
			}
			typ := d.Recv.List[0].Type
			for {
				switch x := typ.(type) {
				case *ast.StarExpr:
					typ = x.X
					continue
				case *ast.IndexExpr:
					typ = x.X
					continue
				case *ast.IndexListExpr:
					typ = x.X
					continue
				}
				break
			}
			if id, ok := typ.(*ast.Ident); ok {
				member(id.Name, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					top(s.Name.Name)
					var fields *ast.FieldList
					switch ty := s.Type.(type) {
					case *ast.StructType:
						fields = ty.Fields
					case *ast.InterfaceType:
						fields = ty.Methods
					}
					if fields != nil {
						for _, fl := range fields.List {
							for _, nm := range fl.Names {
								member(s.Name.Name, nm.Name)
							}
							if len(fl.Names) == 0 { // embedded: its name is a field
								ty := fl.Type
								if st, ok := ty.(*ast.StarExpr); ok {
									ty = st.X
								}
								switch e := ty.(type) {
								case *ast.Ident:
									member(s.Name.Name, e.Name)
								case *ast.SelectorExpr:
									member(s.Name.Name, e.Sel.Name)
								}
							}
						}
					}
				case *ast.ValueSpec:
					for _, nm := range s.Names {
						top(nm.Name)
					}
				}
			}
		}
	}
}

// loadNames reads every Go file of the repository (every module) and the
// top-level package of each host module.
func loadNames(t *testing.T) *names {
	t.Helper()
	n := newNames()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			n.add(t, fset, path, strings.HasSuffix(path, "_test.go"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range hostModules {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", m[1])
		cmd.Dir = filepath.Join(root, m[0])
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -m %s (in %s): %v", m[1], m[0], err)
		}
		files, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", m[1], err)
		}
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				n.add(t, fset, f, false)
			}
		}
	}
	return n
}

// span is a piece of inline code of a page, or a line of a fenced block
// other than Go (a shell session), with where it is.
type span struct {
	where, text string
	fenced      bool
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// spans returns the inline code of the page at path, outside fenced blocks,
// and the lines of its fenced blocks that are not Go (Go blocks are
// compiled: TestREADMEBlocksAreCompiledExamples).
func spans(t *testing.T, path string) []span {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []span
	fence := "" // the open fence's language, or "" outside one
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		where := filepath.Base(path) + ":" + strconv.Itoa(line)
		if strings.HasPrefix(strings.TrimSpace(text), "```") {
			if in {
				in = false
			} else {
				in, fence = true, strings.TrimPrefix(strings.TrimSpace(text), "```")
			}
			continue
		}
		if in {
			if fence != "go" {
				out = append(out, span{where, text, true})
			}
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(text, -1) {
			out = append(out, span{where, m[1], false})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	// pkg.Name or pkg.Type.Member, the package possibly given by its path
	// (internal/guard.WithDone).
	qualified = regexp.MustCompile(`(?:^|[^\w./])((?:[a-z][\w]*/)*)([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	// Type.Member, as Locker.CancelRun.
	typeMember = regexp.MustCompile(`(?:^|[^\w./])([A-Z]\w*)\.([A-Z]\w*)`)
	// Name( not after a dot: a function, an option, a method.
	call = regexp.MustCompile(`(?:^|[^\w.])([A-Z]\w*)\(`)
	// A span that is one exported name.
	bare = regexp.MustCompile(`^[A-Z]\w*$`)
	// jobguard <cmd> and make <target>.
	command    = regexp.MustCompile(`(?:^|[^\w/.-])jobguard ([a-z][\w-]*)`)
	makeTarget = regexp.MustCompile(`(?:^|[^\w])make ([a-z][\w-]*)`)
	testName   = regexp.MustCompile(`\b(Test[A-Z]\w*)(?:/(\w+))?`)
)

// libraries whose names the docs write qualified but this test does not
// read (the standard library, and libraries named only in passing): a name
// qualified by one of them is not checked.
func ours(n *names, pkg string) bool {
	_, ok := n.pkgs[pkg]
	return ok && pkg != "main"
}

// Every Go name that README.md and docs/*.md write in code (`pkg.Name`,
// `pkg.Type.Member`, `Type.Member`, `Name(...)`, or a span that is one
// exported name) is an exported name of this repository or of asynq, cron,
// go-redis or gocron; every `jobguard <cmd>` is a command of cmd/jobguard,
// every `make <target>` a target of the Makefile, and every Test function
// the docs name exists.
func TestDocsNameWhatExists(t *testing.T) {
	n := loadNames(t)
	targets := makeTargets(t)
	var cmds []string
	for _, page := range docs(t) {
		for _, s := range spans(t, page) {
			text := s.text
			if !s.fenced {
				for _, m := range qualified.FindAllStringSubmatch(text, -1) {
					dir, pkg, name, member := m[1], m[2], m[3], m[4]
					if !ours(n, pkg) || (pkg == "guard" && !strings.HasSuffix(dir, "internal/")) {
						continue // another library's, or a variable (guard.Add of a cronguard.Guard)
					}
					if !n.pkgs[pkg][name] {
						t.Errorf("%s: `%s`: package %s has no exported %s", s.where, text, pkg, name)
						continue
					}
					if member != "" && !n.members[name][member] {
						t.Errorf("%s: `%s`: %s.%s has no exported %s", s.where, text, pkg, name, member)
					}
				}
				for _, m := range typeMember.FindAllStringSubmatch(text, -1) {
					if n.members[m[1]] == nil {
						if !n.all[m[1]] {
							t.Errorf("%s: `%s`: no exported type %s", s.where, text, m[1])
						}
						continue
					}
					if !n.members[m[1]][m[2]] {
						t.Errorf("%s: `%s`: %s has no exported %s", s.where, text, m[1], m[2])
					}
				}
				for _, m := range call.FindAllStringSubmatch(text, -1) {
					if !n.all[m[1]] {
						t.Errorf("%s: `%s`: no exported %s", s.where, text, m[1])
					}
				}
				if bare.MatchString(text) && strings.ToUpper(text) != text && !strings.HasPrefix(text, "Test") && !n.all[text] {
					t.Errorf("%s: `%s`: no exported %s", s.where, text, text)
				}
			}
			for _, m := range makeTarget.FindAllStringSubmatch(text, -1) {
				if !targets[m[1]] {
					t.Errorf("%s: `%s`: the Makefile has no target %s", s.where, text, m[1])
				}
			}
			for _, m := range command.FindAllStringSubmatch(text, -1) {
				cmds = append(cmds, s.where+"\x00"+m[1])
			}
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllStringSubmatch(string(b), -1) {
			if !n.tests[m[1]] {
				t.Errorf("%s: names %s, which is no Test function of the repository", filepath.Base(page), m[1])
			}
			if m[2] != "" && !n.subs[m[2]] {
				t.Errorf("%s: names %s, whose subtest %s no test file names", filepath.Base(page), m[0], m[2])
			}
		}
	}
	checkCommands(t, cmds)
}

// makeTargets returns the Makefile's targets.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	rule := regexp.MustCompile(`(?m)^([a-z][\w-]*)\s*:([^=]|$)`)
	for _, m := range rule.FindAllStringSubmatch(string(b), -1) {
		targets[m[1]] = true
	}
	if !targets["test"] {
		t.Fatal("the Makefile has no test target: its rules were not read")
	}
	return targets
}

// checkCommands builds cmd/jobguard and asks it for each command the docs
// name (each where\x00cmd), with too many arguments: a command it knows
// refuses them, one it does not says "unknown command". Neither talks to
// Redis.
func checkCommands(t *testing.T, cmds []string) {
	t.Helper()
	if len(cmds) == 0 {
		t.Fatal("the docs name no jobguard command: they were not read")
	}
	exe := filepath.Join(t.TempDir(), "jobguard")
	build := exec.Command("go", "build", "-o", exe, "./cmd/jobguard")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/jobguard: %v\n%s", err, out)
	}
	known := map[string]bool{}
	for _, c := range cmds {
		where, cmd, _ := strings.Cut(c, "\x00")
		ok, seen := known[cmd]
		if !seen {
			run := exec.Command(exe, cmd, "a", "b", "c")
			run.Env = append(os.Environ(), "REDIS_ADDR=127.0.0.1:1")
			out, _ := run.CombinedOutput()
			ok = !strings.Contains(string(out), "unknown command")
			known[cmd] = ok
		}
		if !ok {
			t.Errorf("%s: `jobguard %s`: cmd/jobguard has no command %s", where, cmd, cmd)
		}
	}
	if !known["why"] && !known["ls"] {
		t.Errorf("neither jobguard ls nor jobguard why was checked: %v", known)
	}
}

// Each numbered rule of docs/rules.md (when a task completes without
// running) names the test that proves it, beside it.
func TestEachRuleNamesItsTest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	item := regexp.MustCompile(`^(\d+)\. `)
	var rules []string // each numbered item with its continuation lines
	open := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case item.MatchString(line):
			rules, open = append(rules, line), true
		case open && (strings.HasPrefix(line, " ") || line == ""):
			rules[len(rules)-1] += "\n" + line
		default:
			open = false // a paragraph or a heading ends the item
		}
	}
	for _, r := range rules {
		if !testName.MatchString(r) {
			t.Errorf("docs/rules.md: rule %q names no Test function", strings.SplitN(r, "\n", 2)[0])
		}
	}
	if len(rules) < 6 {
		t.Fatalf("docs/rules.md: want its numbered rules (at least 6), read %d", len(rules))
	}
}
