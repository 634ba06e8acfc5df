// Command apicount prints, for each package directory given, the number of
// exported top-level identifiers (funcs, types, and each name in a const or
// var declaration) and that number plus the exported methods of exported
// types, read with go/parser from the package's non-test files.
//
//	go run ./internal/apicount ./lockkit ./middleware
//	go run ./internal/apicount -names ./middleware
//
// With -names it prints each package's exported names instead, one a line
// ("pkg Name" or "pkg Type.Method"), sorted.
//
// A name declared as another's alias (type T = pkg.U, var V = pkg.W, const
// C = pkg.D, pkg one of this repository's packages) is the same piece of
// API as the name it stands for: the DISTINCT line counts each piece once,
// wherever it is reachable from, and counts the exported methods of an
// aliased type (read from the package that declares it, an internal one
// included) as reachable through the alias.
//
// An argument ending in "/..." counts every package under it, skipping
// testdata, internal directories, other modules and packages main; a TOTAL
// line follows when more than one package is counted. An interface's
// methods count as methods of its type.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// module is this repository's module path; its packages resolve to
// directories under root.
const module = "github.com/jobguard/jobguard"

// count is one package's exported API.
type count struct {
	dir     string
	top     int      // exported funcs, types, consts and vars
	methods int      // exported methods of exported types
	names   []string // each counted name, methods as Type.Method
	ids     []string // the piece of API each name is ("path.Name", an alias's target's)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: apicount [-names] DIR|DIR/... ...")
		os.Exit(2)
	}
	args := os.Args[1:]
	names := false
	if args[0] == "-names" {
		names, args = true, args[1:]
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	var dirs []string
	for _, arg := range args {
		if r, ok := strings.CutSuffix(arg, "/..."); ok {
			found, err := walk(r)
			if err != nil {
				fmt.Fprintln(os.Stderr, "apicount:", err)
				os.Exit(1)
			}
			dirs = append(dirs, found...)
			continue
		}
		dirs = append(dirs, arg)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "package\ttop-level\twith methods\t")
	var total count
	distinct := map[string]bool{}
	n := 0
	for _, dir := range dirs {
		c, ok, err := countDir(root, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(1)
		}
		if !ok {
			continue
		}
		n++
		if names {
			sort.Strings(c.names)
			for _, name := range c.names {
				fmt.Println(c.dir, name)
			}
			continue
		}
		for _, id := range c.ids {
			distinct[id] = true
		}
		total.top += c.top
		total.methods += c.methods
		fmt.Fprintf(w, "%s\t%d\t%d\t\n", c.dir, c.top, c.top+c.methods)
	}
	if names {
		return
	}
	if n > 1 {
		fmt.Fprintf(w, "TOTAL\t%d\t%d\t\n", total.top, total.top+total.methods)
		fmt.Fprintf(w, "DISTINCT (aliases once)\t\t%d\t\n", len(distinct))
	}
	w.Flush()
}

// repoRoot is the directory of the go.mod declaring module, found upwards
// from the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module "+module+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", module)
		}
		dir = parent
	}
}

// walk lists the directories under root, skipping testdata, internal,
// hidden directories and other modules.
func walk(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (name == "testdata" || name == "internal" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		dirs = append(dirs, path)
		return nil
	})
	sort.Strings(dirs)
	return dirs, err
}

// parse reads the non-test files of the package in dir; it returns none
// when dir holds no package other than main.
func parse(dir string) ([]*ast.File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if f.Name.Name == "main" {
			return nil, nil
		}
		files = append(files, f)
	}
	return files, nil
}

// countDir counts the exported API of the package in dir. ok is false when
// dir holds no non-test Go file of a package other than main.
func countDir(root, dir string) (c count, ok bool, err error) {
	files, err := parse(dir)
	if err != nil || len(files) == 0 {
		return c, false, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return c, false, err
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return c, false, err
	}
	path := module
	if rel != "." {
		path += "/" + filepath.ToSlash(rel)
	}
	c.dir = filepath.Clean(dir)
	for _, f := range files {
		countFile(root, path, f, &c)
	}
	return c, true, nil
}

func countFile(root, path string, f *ast.File, c *count) {
	imports := map[string]string{} // local name → import path
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		imports[name] = p
	}
	target := func(x ast.Expr) (string, bool) {
		sel, ok := x.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return "", false
		}
		p, ok := imports[id.Name]
		if !ok || !strings.HasPrefix(p, module) {
			return "", false
		}
		return p + "." + sel.Sel.Name, true
	}
	add := func(name, id string, method bool) {
		if method {
			c.methods++
		} else {
			c.top++
		}
		c.names = append(c.names, name)
		c.ids = append(c.ids, id)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				add(d.Name.Name, path+"."+d.Name.Name, false)
			} else if recv, ok := recvName(d.Recv); ok {
				add(recv+"."+d.Name.Name, path+"."+recv+"."+d.Name.Name, true)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if t, ok := target(s.Type); ok && s.Assign.IsValid() {
						add(s.Name.Name, t, false)
						for _, m := range aliasedMethods(root, t) {
							add(s.Name.Name+"."+m, t+"."+m, true)
						}
						continue
					}
					add(s.Name.Name, path+"."+s.Name.Name, false)
					for _, m := range interfaceMethods(s) {
						add(s.Name.Name+"."+m, path+"."+s.Name.Name+"."+m, true)
					}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						id := path + "." + n.Name
						if i < len(s.Values) {
							if t, ok := target(s.Values[i]); ok {
								id = t
							}
						}
						add(n.Name, id, false)
					}
				}
			}
		}
	}
}

// aliasedMethods names the exported methods of the type t ("path.Type"),
// read from the package that declares it.
func aliasedMethods(root, t string) []string {
	i := strings.LastIndex(t, ".")
	path, typ := t[:i], t[i+1:]
	dir := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(strings.TrimPrefix(path, module), "/")))
	files, err := parse(dir)
	if err != nil {
		return nil
	}
	var ms []string
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && d.Name.IsExported() {
					if recv, _ := recvName(d.Recv); recv == typ {
						ms = append(ms, d.Name.Name)
					}
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					if s, ok := spec.(*ast.TypeSpec); ok && s.Name.Name == typ {
						ms = append(ms, interfaceMethods(s)...)
					}
				}
			}
		}
	}
	sort.Strings(ms)
	return ms
}

// recvName names a method's receiver type; ok is false when that type is
// not exported.
func recvName(recv *ast.FieldList) (name string, ok bool) {
	if len(recv.List) == 0 {
		return "", false
	}
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.Name, x.IsExported()
		default:
			return "", false
		}
	}
}

// interfaceMethods names the exported methods an exported interface
// declares (embedded interfaces are not counted again).
func interfaceMethods(s *ast.TypeSpec) []string {
	it, ok := s.Type.(*ast.InterfaceType)
	if !ok {
		return nil
	}
	var n []string
	for _, m := range it.Methods.List {
		if _, isFunc := m.Type.(*ast.FuncType); !isFunc {
			continue
		}
		for _, name := range m.Names {
			if name.IsExported() {
				n = append(n, name.Name)
			}
		}
	}
	return n
}
