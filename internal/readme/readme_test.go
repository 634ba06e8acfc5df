package readme

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module's root, from this package's directory.
const root = "../.."

// docs returns README.md and the pages of docs/.
func docs(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docs/ has no pages")
	}
	return append([]string{filepath.Join(root, "README.md")}, pages...)
}

// blocks returns the ```go blocks of the page at path, each as its lines.
func blocks(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out [][]string
		cur []string
		in  bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```go":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			out = append(out, cur)
		case in:
			cur = append(cur, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// normalize drops indentation and blank lines, which gofmt and the
// surrounding function change.
func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// exampleFiles returns the lines of every example_test.go of the module's
// packages (bench/ and faults/ are other modules), and of the programs in
// examples/ (a README block may be a whole program).
func exampleFiles(t *testing.T) map[string][]string {
	t.Helper()
	files := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bench" || d.Name() == "faults" || strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.Name() == "example_test.go" || (d.Name() == "main.go" && strings.Contains(path, string(filepath.Separator)+"examples"+string(filepath.Separator))) {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files[path] = normalize(strings.Split(string(b), "\n"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func contains(haystack, needle []string) bool {
	for i := 0; i+len(needle) <= len(haystack); i++ {
		ok := true
		for j := range needle {
			if haystack[i+j] != needle[j] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// Every Go block of the README and of docs/ is code that compiles: it
// appears, line for line, in an example_test.go.
func TestREADMEBlocksAreCompiledExamples(t *testing.T) {
	files := exampleFiles(t)
	for _, page := range docs(t) {
		checkBlocks(t, page, files)
	}
}

func checkBlocks(t *testing.T, page string, files map[string][]string) {
	bs := blocks(t, page)
	if filepath.Base(page) == "README.md" && len(bs) == 0 {
		t.Fatal("the README has no ```go blocks")
	}
	for i, b := range bs {
		want := normalize(b)
		found := false
		for _, lines := range files {
			if contains(lines, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: go block %d (starting %q) is in no example_test.go", page, i+1, want[0])
		}
	}
}
