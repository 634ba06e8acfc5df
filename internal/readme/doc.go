// Package readme holds the tests that keep README.md and docs/*.md true to
// the code: each Go code block must appear, line for line, in an example
// test of the module, where the compiler and go vet check it; the README's
// complete program runs in a module of its own; every Go name the pages
// write in code (`pkg.Name`, `Type.Member`, `Name(`) is an exported name of
// this repository or of the libraries it plugs into, every `jobguard <cmd>`
// a command, every `make <target>` a target and every Test function named
// one that exists; and each numbered rule of docs/rules.md names its test.
package readme
