// Package webtest drives opsview's page in a real headless browser
// (Debian's chromium through chromedp). It is a module of its own so that
// chromedp is in no user's build; make test-browser runs it.
package webtest
