// Package readme holds the test that keeps the README's Go code blocks
// compiled: each block must appear, line for line, in an example test of
// the module, where the compiler and go vet check it.
package readme
