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
	"strings"
	"text/tabwriter"
)

// count is one package's exported API.
type count struct {
	dir     string
	top     int      // exported funcs, types, consts and vars
	methods int      // exported methods of exported types
	names   []string // each counted name, methods as Type.Method
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: apicount DIR|DIR/... ...")
		os.Exit(2)
	}
	args := os.Args[1:]
	names := false
	if args[0] == "-names" {
		names, args = true, args[1:]
	}
	var dirs []string
	for _, arg := range args {
		if root, ok := strings.CutSuffix(arg, "/..."); ok {
			found, err := walk(root)
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
	n := 0
	for _, dir := range dirs {
		c, ok, err := countDir(dir)
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
		total.top += c.top
		total.methods += c.methods
		fmt.Fprintf(w, "%s\t%d\t%d\t\n", c.dir, c.top, c.top+c.methods)
	}
	if names {
		return
	}
	if n > 1 {
		fmt.Fprintf(w, "TOTAL\t%d\t%d\t\n", total.top, total.top+total.methods)
	}
	w.Flush()
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

// countDir counts the exported API of the package in dir. ok is false when
// dir holds no non-test Go file of a package other than main.
func countDir(dir string) (c count, ok bool, err error) {
	fset := token.NewFileSet()
	skipTests := func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }
	pkgs, err := parser.ParseDir(fset, dir, skipTests, parser.SkipObjectResolution)
	if err != nil {
		return c, false, err
	}
	c.dir = filepath.Clean(dir)
	for name, pkg := range pkgs {
		if name == "main" {
			continue
		}
		ok = true
		for _, f := range pkg.Files {
			countFile(f, &c)
		}
	}
	return c, ok, nil
}

func countFile(f *ast.File, c *count) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				c.top++
				c.names = append(c.names, d.Name.Name)
			} else if recv, ok := recvName(d.Recv); ok {
				c.methods++
				c.names = append(c.names, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						c.top++
						c.names = append(c.names, s.Name.Name)
						for _, m := range interfaceMethods(s) {
							c.methods++
							c.names = append(c.names, s.Name.Name+"."+m)
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							c.top++
							c.names = append(c.names, n.Name)
						}
					}
				}
			}
		}
	}
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
